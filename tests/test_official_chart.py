"""The values files for the official Datadog chart (deploy/helm/datadog-values*.yaml), rendered
offline by that chart (its vendored copy, see deploy_support.DATADOG_CHART) with Helm's own Go
engine: what every key of each file does to the Agent DaemonSet, and local mode on the NVIDIA
runtime without the Agent's built-in `gpu` check, a duplicate env name or pod-resources mount."""

import copy
import posixpath
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Tuple

import pytest
import yaml

from gpu_monitoring import __about__

from .deploy_support import (
    AGENT_DOCKERFILE,
    DATADOG_RELEASE,
    DATADOG_VALUES,
    DATADOG_VALUES_LOCAL,
    GPU_TOLERATION,
    K8S_VERSIONS,
    POD_RESOURCES_HOST_DIR,
    PROC_READS,
    SYSFS_READS,
    chart_socket_path,
    chart_values,
    daemonset,
    datadog_chart_defaults,
    dockerfile_args,
    merge_values,
    needs_datadog_chart,
    pod_spec,
    render_datadog,
    validate,
)
from .official_chart_support import (
    FEATURES,
    VALUES_FILES,
    Render,
    all_containers,
    builtin_gpu_check_enabled,
    env_of,
    overlapping_mounts,
    values_file_renders,
    values_of,
)

pytestmark = needs_datadog_chart


@pytest.fixture(scope="module")
def renders():
    return values_file_renders()


# --- what each key does -------------------------------------------------------------------------


def confd_lands_in_conf_d(r: Render) -> None:
    text = r.values["datadog"]["confd"]["gpu_monitoring.yaml"]
    configmap = r.configmap(f"{DATADOG_RELEASE}-confd")
    assert configmap["data"]["gpu_monitoring.yaml"] == text
    assert r.volume("confd")["configMap"]["name"] == configmap["metadata"]["name"]
    # init-config runs the image's /etc/cont-init.d scripts, which copy /conf.d/* into the config
    # volume's conf.d/, and the agent container reads that volume as /etc/datadog-agent.
    init = r.init_containers["init-config"]
    assert "/etc/cont-init.d/" in " ".join(init["args"])
    assert r.mount_of(init, "/conf.d/gpu_monitoring.yaml")[1]["name"] == "confd"
    config = r.mount_of(init, "/etc/datadog-agent/conf.d")[1]
    assert r.mount_of(r.agent, "/etc/datadog-agent/conf.d/gpu_monitoring.yaml")[1] == config
    assert "emptyDir" in config
    # Pods restart when the check's configuration changes.
    assert r.daemonset["spec"]["template"]["metadata"]["annotations"]["checksum/confd-config"]


def sidecar_confd(r: Render) -> None:
    confd_lands_in_conf_d(r)
    assert r.instance["source"] == "sidecar"
    assert r.instance["sidecar_socket"] == chart_socket_path()
    mount, volume = r.mount_of(r.agent, r.instance["sidecar_socket"])
    assert volume["name"] == "gpu-monitoring-socket"
    assert mount["mountPath"] == posixpath.dirname(r.instance["sidecar_socket"])


def local_confd(r: Render) -> None:
    confd_lands_in_conf_d(r)
    assert r.instance["source"] == "local"
    # proc_root is the host's /proc (NVML reports host PIDs).
    assert r.mount_of(r.agent, r.instance["proc_root"] + "/1")[1]["hostPath"]["path"] == "/proc"
    # pod_resources_socket is where the host's pod-resources directory is in this container, the
    # path the chart gives the Agent itself.
    socket = r.instance["pod_resources_socket"]
    mount, volume = r.mount_of(r.agent, socket)
    assert volume["hostPath"]["path"].rstrip("/") == POD_RESOURCES_HOST_DIR
    assert socket == posixpath.join(mount["mountPath"], "kubelet.sock")
    assert env_of(r.agent)["DD_KUBERNETES_KUBELET_PODRESOURCES_SOCKET"] == socket
    # kubernetes: true reads the kubelet at the host the Agent is given.
    assert r.instance["kubernetes"] is True
    assert "DD_KUBERNETES_KUBELET_HOST" in env_of(r.agent)
    # The boot ID and the driver's GPU list are on the host's /proc too.
    for path in PROC_READS:
        assert r.mount_of(r.agent, posixpath.join(r.instance["proc_root"], *path))[1]["hostPath"]["path"] == "/proc"
    # sysfs_root is the host's /sys, read-only, for everything the check reads below it.
    for directory in SYSFS_READS:
        mount, volume = r.mount_of(r.agent, posixpath.join(r.instance["sysfs_root"], *directory))
        assert mount["mountPath"] == r.instance["sysfs_root"]
        assert mount["readOnly"] is True and volume["hostPath"]["path"] == "/sys"
    # kernel_log: auto opens /dev/kmsg, the host's, read-only, with SYSLOG in the agent container.
    assert r.instance["kernel_log"] == "auto"
    mount, volume = r.mount_of(r.agent, "/dev/kmsg")
    assert mount["mountPath"] == "/dev/kmsg" and mount["readOnly"] is True
    assert volume["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert "SYSLOG" in r.agent["securityContext"]["capabilities"]["add"]


def image_repository(r: Render) -> None:
    repository = r.values["agents"]["image"]["repository"]
    for container in all_containers(r):
        assert container["image"].startswith(repository + ":"), container["name"]
    # The Cluster Agent keeps its own image.
    (dca,) = [o for o in r.objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("cluster-agent")]
    assert not any(c["image"].startswith(repository) for c in dca["spec"]["template"]["spec"]["containers"])


def image_tag(r: Render) -> None:
    tag = r.values["agents"]["image"]["tag"]
    # The Agent release the chart was made for, and the one the image builds on.
    assert tag == str(datadog_chart_defaults()["agents"]["image"]["tag"])
    assert tag == dockerfile_args(AGENT_DOCKERFILE)["AGENT_VERSION"]
    for container in all_containers(r):
        assert container["image"].rpartition(":")[2].startswith(tag + "-"), container["name"]
    # A path the chart takes only for Agent 7.75 and later, read from this tag.
    assert r.containers["trace-agent"]["command"][0] == "trace-loader"
    assert "doNotCheckTag" not in r.values["agents"]["image"]


def image_tag_suffix(r: Render) -> None:
    image = r.values["agents"]["image"]
    expected = f"{dockerfile_args(AGENT_DOCKERFILE)['AGENT_VERSION']}-gpumon{__about__.__version__}"
    for container in all_containers(r):
        assert container["image"] == f"{image['repository']}:{expected}", container["name"]


def socket_volume(r: Render) -> None:
    (declared,) = r.values["agents"]["volumes"]
    assert r.volume(declared["name"]) == declared
    assert declared["hostPath"]["path"] == chart_values()["sidecar"]["socketDir"]


def socket_volume_mounts(r: Render) -> None:
    (declared,) = r.values["agents"]["volumeMounts"]
    with_mount = {name for name, c in r.containers.items() if declared in c["volumeMounts"]}
    # Every Agent container: the chart has no volumeMounts key for the agent container alone.
    assert with_mount == set(r.containers) and "agent" in with_mount
    assert not any(declared in c["volumeMounts"] for c in r.init_containers.values())
    assert declared["readOnly"] is True


def declared(r: Render, key: str, name: str) -> Dict[str, Any]:
    """The entry of agents.<key> (volumes, volumeMounts) of that name."""
    (found,) = [entry for entry in r.values["agents"][key] if entry["name"] == name]
    return found


def sysfs_and_kmsg_volumes(r: Render) -> None:
    assert [v["name"] for v in r.values["agents"]["volumes"]] == ["host-sysfs", "kmsg"]
    sysfs, kmsg = declared(r, "volumes", "host-sysfs"), declared(r, "volumes", "kmsg")
    assert r.volume(sysfs["name"]) == sysfs and r.volume(kmsg["name"]) == kmsg
    assert sysfs["hostPath"] == {"path": "/sys", "type": "Directory"}
    assert kmsg["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}


def sysfs_and_kmsg_volume_mounts(r: Render) -> None:
    assert [m["name"] for m in r.values["agents"]["volumeMounts"]] == ["host-sysfs", "kmsg"]
    sysfs, kmsg = declared(r, "volumeMounts", "host-sysfs"), declared(r, "volumeMounts", "kmsg")
    assert sysfs["mountPath"] == r.instance["sysfs_root"]
    assert sysfs["readOnly"] is True and sysfs["recursiveReadOnly"] == "IfPossible"
    # The device itself, read-only, where kernel_log: auto opens it.
    assert kmsg == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    # Every Agent container gets them as they are, no init container does.
    for mount in (sysfs, kmsg):
        assert all(mount in c["volumeMounts"] for c in r.containers.values())
        assert not any(mount in c.get("volumeMounts", []) for c in r.init_containers.values())


def agent_syslog(r: Render) -> None:
    """SYSLOG is the one capability the values add, to the agent container alone; the chart's own stay."""
    without = copy.deepcopy(r.values)
    del without["agents"]["containers"]["agent"]["securityContext"]
    before = Render(without, render_datadog(without))
    security, security_before = r.agent["securityContext"], before.agent["securityContext"]
    added = security["capabilities"]["add"]
    assert [c for c in added if c not in security_before["capabilities"]["add"]] == ["SYSLOG"]
    # Nothing else changes: the chart's MKNOD (datadog.gpuMonitoring) and readOnlyRootFilesystem stay,
    # no drop list goes or comes.
    assert dict(security, capabilities={"add": [c for c in added if c != "SYSLOG"]}) == security_before
    assert security["readOnlyRootFilesystem"] is True
    for name, container in r.containers.items():
        if name != "agent":
            assert container.get("securityContext") == before.containers[name].get("securityContext"), name


def tolerations(r: Render) -> None:
    assert r.pod["tolerations"] == r.values["agents"]["tolerations"]
    assert GPU_TOLERATION in r.pod["tolerations"]


def affinity(r: Render) -> None:
    assert r.pod["affinity"] == r.values["agents"]["affinity"]
    (term,) = r.pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]} in term["matchExpressions"]


def gpu_monitoring_enabled(r: Render) -> None:
    assert r.values["datadog"]["gpuMonitoring"]["enabled"] is True
    env = env_of(r.agent)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    # What it turns on besides, and agents.containers.agent.env turns off again.
    assert env["DD_GPU_ENABLED"] == "true"
    assert "pod-resources-socket" in [m["name"] for m in r.agent["volumeMounts"]]
    assert r.volume("pod-resources-socket")["hostPath"]["path"].rstrip("/") == POD_RESOURCES_HOST_DIR


def runtime_class(r: Render) -> None:
    assert r.pod["runtimeClassName"] == r.values["datadog"]["gpuMonitoring"]["runtimeClassName"] == "nvidia"


def agent_env(r: Render) -> None:
    declared = r.values["agents"]["containers"]["agent"]["env"]
    names = [e["name"] for e in r.agent["env"]]
    for entry in declared:
        assert names.count(entry["name"]) == 1, entry["name"]
        assert env_of(r.agent)[entry["name"]] == entry["value"]
        others = [n for n, c in r.containers.items() if n != "agent" and entry["name"] in env_of(c)]
        assert not others, f"{entry['name']} also in {others}"
    assert env_of(r.agent)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert not builtin_gpu_check_enabled(env_of(r.agent))


KEY_CHECKS: Dict[Path, Dict[Tuple[str, ...], Callable[[Render], None]]] = {
    DATADOG_VALUES: {
        ("datadog", "confd", "gpu_monitoring.yaml"): sidecar_confd,
        ("agents", "image", "repository"): image_repository,
        ("agents", "image", "tag"): image_tag,
        ("agents", "image", "tagSuffix"): image_tag_suffix,
        ("agents", "volumes"): socket_volume,
        ("agents", "volumeMounts"): socket_volume_mounts,
        ("agents", "tolerations"): tolerations,
    },
    DATADOG_VALUES_LOCAL: {
        ("datadog", "gpuMonitoring", "enabled"): gpu_monitoring_enabled,
        ("datadog", "gpuMonitoring", "runtimeClassName"): runtime_class,
        ("datadog", "confd", "gpu_monitoring.yaml"): local_confd,
        ("agents", "image", "repository"): image_repository,
        ("agents", "image", "tag"): image_tag,
        ("agents", "image", "tagSuffix"): image_tag_suffix,
        ("agents", "containers", "agent", "env"): agent_env,
        ("agents", "containers", "agent", "securityContext"): agent_syslog,
        ("agents", "volumes"): sysfs_and_kmsg_volumes,
        ("agents", "volumeMounts"): sysfs_and_kmsg_volume_mounts,
        ("agents", "tolerations"): tolerations,
        ("agents", "affinity"): affinity,
    },
}


def leaf_keys(values: Dict[str, Any], prefix: Tuple[str, ...] = ()) -> Iterator[Tuple[str, ...]]:
    for key, value in values.items():
        if isinstance(value, dict):
            yield from leaf_keys(value, prefix + (key,))
        else:
            yield prefix + (key,)


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_every_key_has_a_check_of_its_effect(path):
    checked = KEY_CHECKS[path]
    leaves = list(leaf_keys(values_of(path)))
    for leaf in leaves:
        assert any(leaf[: len(key)] == key for key in checked), f"{'.'.join(leaf)}: nothing checks it in the render"
    for key in checked:
        assert any(leaf[: len(key)] == key for leaf in leaves), f"{'.'.join(key)}: not in {path.name}"


@pytest.mark.parametrize(
    "path,key",
    [(path, key) for path, checks in KEY_CHECKS.items() for key in checks],
    ids=lambda x: x.name if isinstance(x, Path) else ".".join(x),
)
def test_key_does_what_its_comment_says(renders, path, key):
    KEY_CHECKS[path][key](renders[path])


# --- the Agent pod as a whole -------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_rendered_agent_daemonset_is_valid(renders, path, version):
    validate(renders[path].daemonset, version)


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_no_env_name_twice_in_a_container(renders, path):
    for container in all_containers(renders[path]):
        names = [e["name"] for e in container.get("env", [])]
        assert sorted({n for n in names if names.count(n) > 1}) == [], container["name"]


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_pod_resources_mounted_at_most_once_per_container(renders, path):
    r = renders[path]
    for container in all_containers(r):
        mounts = [
            m
            for m in container.get("volumeMounts", [])
            if r.volume(m["name"]).get("hostPath", {}).get("path", "").rstrip("/") == POD_RESOURCES_HOST_DIR
        ]
        assert len(mounts) <= 1, container["name"]


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_the_agents_builtin_gpu_check_stays_off(renders, path):
    r = renders[path]
    assert not builtin_gpu_check_enabled(env_of(r.agent))
    # Nor does system-probe collect GPUs (datadog.gpuMonitoring.privilegedMode stays off).
    system_probe = yaml.safe_load(r.configmap(f"{DATADOG_RELEASE}-system-probe-config")["data"]["system-probe.yaml"])
    assert system_probe.get("gpu_monitoring", {}).get("enabled", False) is False


def test_without_the_feature_exclusion_local_mode_would_run_both_gpu_checks():
    values = values_of(DATADOG_VALUES_LOCAL)
    env = values["agents"]["containers"]["agent"]["env"]
    values["agents"]["containers"]["agent"]["env"] = [e for e in env if e["name"] != "DD_AUTOCONFIG_EXCLUDE_FEATURES"]
    agent = Render(values, render_datadog(values)).agent
    assert builtin_gpu_check_enabled(env_of(agent))


def test_sidecar_mode_keeps_the_agent_pod_off_the_nvidia_runtime(renders):
    r = renders[DATADOG_VALUES]
    assert "runtimeClassName" not in r.pod
    for container in all_containers(r):
        assert not {"NVIDIA_VISIBLE_DEVICES", "DD_GPU_ENABLED"} & set(env_of(container)), container["name"]




def test_local_mode_sysfs_and_kmsg_are_alone_at_their_paths_in_every_agent_container():
    """With every chart feature that adds a container on, the host's /sys and /dev/kmsg still overlap
    no chart mount; at /host/sys the first would sit above the host's cgroups, which the chart mounts
    at /host/sys/fs/cgroup."""
    values = merge_values(FEATURES, values_of(DATADOG_VALUES_LOCAL))
    r = Render(values, render_datadog(values))
    sysfs, kmsg = (declared(r, "volumeMounts", name) for name in ("host-sysfs", "kmsg"))
    assert len(r.containers) > 3
    for name, container in r.containers.items():
        # /dev/kmsg too: no chart mount of /dev or of the device in any of them.
        for mount in (sysfs, kmsg):
            assert mount in container["volumeMounts"], name
            assert overlapping_mounts(container, mount) == [], name
    assert overlapping_mounts(r.agent, dict(sysfs, mountPath="/host/sys")) == ["/host/sys/fs/cgroup"]


def test_the_agent_connects_to_the_sidecar_socket_as_its_owner(renders):
    """The sidecar makes its socket 0660, owned by the user it runs as: uid 0 by default. Connecting
    needs write permission on the socket: the Agent container runs as that uid too (the chart's
    datadog.securityContext), so the owner's bits let it in without any capability."""
    r = renders[DATADOG_VALUES]
    pod_uid = r.pod.get("securityContext", {}).get("runAsUser")
    agent_uid = r.agent.get("securityContext", {}).get("runAsUser", pod_uid)
    sidecar_security = pod_spec(daemonset())["securityContext"]
    assert agent_uid == sidecar_security["runAsUser"] == 0
    assert sidecar_security["runAsGroup"] == 0
