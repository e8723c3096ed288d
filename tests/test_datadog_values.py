"""The values files for the Datadog chart (deploy/helm/datadog-values*.yaml), sidecar mode and local
mode, as files: the check instance each configures, read by the check's own parser; the Agent pod
fields they add, validated against the Kubernetes JSON schemas; paths that match the sidecar chart's
and the product's defaults. What the official chart makes of them: tests/test_official_chart.py."""

import posixpath
from typing import Any, Dict, Tuple

import pytest
import yaml

from gpu_monitoring.config_models import defaults
from gpu_monitoring.sidecar import protocol

from .config_support import derived, validated
from .deploy_support import (
    DATADOG_VALUES,
    DATADOG_VALUES_LOCAL,
    GPU_TOLERATION,
    K8S_VERSIONS,
    POD_RESOURCES_HOST_DIR,
    SYSFS_READS,
    chart_socket_path,
    chart_values,
    validate,
)


def check_instance(values: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    conf = yaml.safe_load(values["datadog"]["confd"]["gpu_monitoring.yaml"])
    assert set(conf) == {"init_config", "instances"}
    assert conf["init_config"] == {}
    (instance,) = conf["instances"]
    return conf, instance


def agent_pod(values: Dict[str, Any]) -> Dict[str, Any]:
    """A Pod carrying what the values add to the Datadog chart's Agent pod, for schema checks."""
    agents = values["agents"]
    agent = agents.get("containers", {}).get("agent", {})
    container = {
        "name": "agent",
        "image": f"{agents['image']['repository']}:{agents['image']['tag']}",
        "env": agent.get("env", []),
        "volumeMounts": agents.get("volumeMounts", []),
    }
    if "securityContext" in agent:
        container["securityContext"] = agent["securityContext"]
    spec = {"containers": [container], "volumes": agents.get("volumes", []), "tolerations": agents["tolerations"]}
    if "affinity" in agents:
        spec["affinity"] = agents["affinity"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "datadog-agent"}, "spec": spec}


def values_mount(values: Dict[str, Any], path: str) -> Tuple[Dict, Dict]:
    """The Agent volumeMount holding `path` in a Datadog values file, and its volume."""
    agents = values["agents"]
    for mount in agents.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/")
        if path.startswith(root + "/"):
            (volume,) = [v for v in agents["volumes"] if v["name"] == mount["name"]]
            return mount, volume
    raise AssertionError(f"{path} is on no agents.volumeMounts entry")


def test_datadog_values_sidecar_mode():
    values = yaml.safe_load(DATADOG_VALUES.read_text())
    _, instance = check_instance(values)
    assert instance["source"] == "sidecar"
    assert instance["sidecar_socket"] == chart_socket_path()
    assert instance["ignore_missing_sidecar"] is True
    assert instance["min_collection_interval"] == 15
    assert instance["hourly_price"] and all(
        isinstance(k, str) and isinstance(v, (int, float)) for k, v in instance["hourly_price"].items()
    )

    image = values["agents"]["image"]
    assert image["repository"] and isinstance(image["tag"], str) and image["tag"]
    assert "doNotCheckTag" not in image

    # The host socket directory, mounted at the same path as in the sidecar.
    mount, volume = values_mount(values, instance["sidecar_socket"])
    assert mount["mountPath"] == posixpath.dirname(instance["sidecar_socket"])
    assert volume["hostPath"]["path"] == mount["mountPath"]
    assert mount["readOnly"] is True

    assert GPU_TOLERATION in values["agents"]["tolerations"]
    # Sidecar mode keeps the Agent pod off the NVIDIA runtime.
    assert "gpuMonitoring" not in values["datadog"]
    # The sidecar reads sysfs, not the check: no sysfs_root, no /sys in the Agent pod.
    assert "sysfs_root" not in instance
    assert all(v.get("hostPath", {}).get("path") != "/sys" for v in values["agents"]["volumes"])
    # Nor the kernel's log: no kernel_log, no /dev/kmsg, no capability added to the Agent.
    assert "kernel_log" not in instance
    assert all(v.get("hostPath", {}).get("path") != "/dev/kmsg" for v in values["agents"]["volumes"])
    assert "containers" not in values["agents"]


def test_datadog_values_local_mode():
    values = yaml.safe_load(DATADOG_VALUES_LOCAL.read_text())
    _, instance = check_instance(values)
    assert instance["source"] == "local"
    assert instance["kubernetes"] is True
    assert instance["proc_root"] == "/host/proc"
    assert "sidecar_socket" not in instance

    # The chart's own pod-resources mount (datadog.gpuMonitoring) has the host path in the container.
    assert instance["pod_resources_socket"] == POD_RESOURCES_HOST_DIR + "/kubelet.sock"

    # The check reads the host's /sys, mounted read-only (submounts too where the runtime can) at
    # sysfs_root, clear of /host/sys where the chart mounts the host's cgroups.
    assert instance["sysfs_root"] == "/host/sysfs"
    volumes = {v["name"]: v for v in values["agents"]["volumes"]}
    mounts = {m["name"]: m for m in values["agents"]["volumeMounts"]}
    assert set(volumes) == set(mounts) == {"host-sysfs", "kmsg"}
    volume, mount = volumes["host-sysfs"], mounts["host-sysfs"]
    assert volume["hostPath"] == {"path": "/sys", "type": "Directory"}
    for directory in SYSFS_READS:
        assert values_mount(values, posixpath.join(instance["sysfs_root"], *directory)) == (mount, volume)
    assert mount["mountPath"] == instance["sysfs_root"]
    assert mount["readOnly"] is True and mount["recursiveReadOnly"] == "IfPossible"
    assert "mountPropagation" not in mount

    # The kernel's log: the host's /dev/kmsg, read-only where kernel_log: auto opens it, and SYSLOG,
    # the one capability the values give the agent container (none dropped, none else added).
    assert instance["kernel_log"] == "auto"
    assert mounts["kmsg"] == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    assert volumes["kmsg"] == {"name": "kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}}
    assert values["agents"]["containers"]["agent"]["securityContext"] == {"capabilities": {"add": ["SYSLOG"]}}

    gpu = values["datadog"]["gpuMonitoring"]
    assert gpu["enabled"] is True and gpu["runtimeClassName"] == "nvidia"
    env = {e["name"]: e["value"] for e in values["agents"]["containers"]["agent"]["env"]}
    # The chart sets NVIDIA_VISIBLE_DEVICES itself once gpuMonitoring is on.
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"

    image = values["agents"]["image"]
    assert image["repository"] and image["tag"] and "doNotCheckTag" not in image
    assert GPU_TOLERATION in values["agents"]["tolerations"]
    (term,) = values["agents"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]} in term["matchExpressions"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", [DATADOG_VALUES, DATADOG_VALUES_LOCAL], ids=lambda p: p.name)
def test_datadog_values_fragments_are_valid_pod_fields(path, version):
    validate(agent_pod(yaml.safe_load(path.read_text())), version)


@pytest.mark.parametrize("path", [DATADOG_VALUES, DATADOG_VALUES_LOCAL], ids=lambda p: p.name)
def test_the_check_reads_every_option_as_written(path):
    """The check's own parser takes each option (a misspelt one would come back as its default)."""
    _, instance = check_instance(yaml.safe_load(path.read_text()))
    parsed, kubernetes = validated(instance), derived(instance).kubernetes
    for name, value in instance.items():
        if name == "min_collection_interval":  # the Agent's, not the check's
            continue
        if name == "kubernetes":
            assert kubernetes == {True: "true", False: "false"}.get(value, value)
        else:
            assert getattr(parsed, name) == value, name


def test_paths_are_the_products_defaults():
    assert chart_socket_path() == protocol.DEFAULT_SOCKET
    assert posixpath.join(chart_values()["sidecar"]["stateDir"], "journal") == protocol.DEFAULT_JOURNAL
    assert POD_RESOURCES_HOST_DIR + "/kubelet.sock" == defaults.instance_pod_resources_socket()


def test_both_modes_use_the_same_agent_image():
    sidecar = yaml.safe_load(DATADOG_VALUES.read_text())["agents"]["image"]
    local = yaml.safe_load(DATADOG_VALUES_LOCAL.read_text())["agents"]["image"]
    assert sidecar == local
