"""The values files for the official Datadog chart (deploy/helm/datadog-values*.yaml), rendered
offline by that chart (its vendored copy, see deploy_support.DATADOG_CHART) with Helm's own Go
engine: what every key of each file does to the Agent DaemonSet; the custom Agent image's tag read
by the chart exactly as the stock Agent release it builds on; local mode on the NVIDIA runtime
without the Agent's built-in `gpu` check, without a duplicate env name or pod-resources mount; and
which containers the sidecar socket's mount reaches."""

import copy
import json
import posixpath
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
import yaml

from gpu_monitoring import __about__

from .deploy_support import (
    AGENT_DOCKERFILE,
    DATADOG_CHART_DETERMINISTIC,
    DATADOG_RELEASE,
    DATADOG_VALUES,
    DATADOG_VALUES_LOCAL,
    GPU_TOLERATION,
    K8S_VERSIONS,
    POD_RESOURCES_HOST_DIR,
    agent_daemonset,
    chart_socket_path,
    chart_values,
    datadog_chart_defaults,
    dockerfile_args,
    helm,
    merge_values,
    needs_datadog_chart,
    render_datadog,
    render_datadog_raw,
    validate,
)

pytestmark = needs_datadog_chart

VALUES_FILES = (DATADOG_VALUES, DATADOG_VALUES_LOCAL)

# Chart features whose templates read agents.image.tag (to pick a code path by Agent version) or
# add a container to the Agent pod: with all of them on, a render shows every tag-dependent branch
# and every container that agents.volumeMounts reaches.
FEATURES: Dict[str, Any] = {
    "datadog": {
        "clusterName": "gpu-cluster",
        "networkMonitoring": {"enabled": True},
        "serviceMonitoring": {"enabled": True},
        "apm": {"portEnabled": True},
        "logs": {"enabled": True},
        "processAgent": {"processCollection": True},
        "otelCollector": {"enabled": True},
        "dataPlane": {"enabled": True, "dogstatsd": {"enabled": True}},
        "securityAgent": {"runtime": {"enabled": True}, "compliance": {"enabled": True}},
        "hostProfiler": {"enabled": True},
        "privateActionRunner": {"enabled": True},
        "instrumentationCrd": {"enabled": True},
    }
}


def values_of(path: Path) -> Dict[str, Any]:
    return yaml.safe_load(path.read_text())


@cache
def _render_raw(values_json: str) -> Dict[str, str]:
    return render_datadog_raw(json.loads(values_json))


def render_raw(values: Dict[str, Any]) -> Dict[str, str]:
    """Deterministic renders, each set of values rendered once per session."""
    return _render_raw(json.dumps(merge_values(DATADOG_CHART_DETERMINISTIC, values), sort_keys=True))


@dataclass
class Render:
    values: Dict[str, Any]
    objects: List[Dict[str, Any]]

    @property
    def daemonset(self) -> Dict[str, Any]:
        return agent_daemonset(self.objects)

    @property
    def pod(self) -> Dict[str, Any]:
        return self.daemonset["spec"]["template"]["spec"]

    @property
    def containers(self) -> Dict[str, Dict[str, Any]]:
        return {c["name"]: c for c in self.pod["containers"]}

    @property
    def init_containers(self) -> Dict[str, Dict[str, Any]]:
        return {c["name"]: c for c in self.pod["initContainers"]}

    @property
    def agent(self) -> Dict[str, Any]:
        return self.containers["agent"]

    @property
    def instance(self) -> Dict[str, Any]:
        (instance,) = yaml.safe_load(self.values["datadog"]["confd"]["gpu_monitoring.yaml"])["instances"]
        return instance

    def volume(self, name: str) -> Dict[str, Any]:
        (found,) = [v for v in self.pod["volumes"] if v["name"] == name]
        return found

    def configmap(self, name: str) -> Dict[str, Any]:
        (found,) = [o for o in self.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
        return found

    def mount_of(self, container: Dict[str, Any], path: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """The container's volumeMount holding `path` (the deepest) and its volume."""
        for mount in sorted(container["volumeMounts"], key=lambda m: len(m["mountPath"]), reverse=True):
            root = mount["mountPath"].rstrip("/")
            if path == root or path.startswith(root + "/"):
                return mount, self.volume(mount["name"])
        raise AssertionError(f"{path} is on no volume mount of {container['name']}")


@pytest.fixture(scope="module")
def renders() -> Dict[Path, Render]:
    return {path: Render(values_of(path), render_datadog(values_of(path))) for path in VALUES_FILES}


def env_of(container: Dict[str, Any]) -> Dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def all_containers(render: Render) -> Iterator[Dict[str, Any]]:
    yield from render.pod["initContainers"]
    yield from render.pod["containers"]


def builtin_gpu_check_enabled(env: Dict[str, Any]) -> bool:
    """Whether the Agent would run its own `gpu` check, from the agent container's env. It needs
    gpu.enabled (DD_GPU_ENABLED) and GPUs found through the `nvml` autoconfig feature, which the
    Agent drops when one of DD_AUTOCONFIG_EXCLUDE_FEATURES's space-separated filters (regular
    expressions, lower-cased, an optional `name:` prefix) matches it, unless
    DD_AUTOCONFIG_INCLUDE_FEATURES names it (datadog-agent pkg/config/env, DetectFeatures)."""
    if str(env.get("DD_GPU_ENABLED", "false")).lower() != "true":
        return False
    if "nvml" in str(env.get("DD_AUTOCONFIG_INCLUDE_FEATURES", "")).lower().split():
        return True
    filters = [f.lower().removeprefix("name:") for f in str(env.get("DD_AUTOCONFIG_EXCLUDE_FEATURES", "")).split()]
    return not any(re.search(f, "nvml") for f in filters)


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


# --- the image tag ------------------------------------------------------------------------------


def with_image(values: Dict[str, Any], **image: Any) -> Dict[str, Any]:
    changed = copy.deepcopy(values)
    changed["agents"]["image"] = dict(image)
    return changed


def stock_image_values(values: Dict[str, Any]) -> Dict[str, Any]:
    """The same values naming the stock Agent release in the same repository, no suffix."""
    image = values["agents"]["image"]
    return with_image(values, repository=image["repository"], tag=image["tag"])


def normalized(values: Dict[str, Any], stock: Dict[str, Any]) -> Dict[str, str]:
    """A render with this image's name replaced by the stock one's: what remains are the chart's
    choices."""
    ours = "{repository}:{tag}".format(**values["agents"]["image"])
    if values["agents"]["image"].get("tagSuffix"):
        ours += "-" + values["agents"]["image"]["tagSuffix"]
    theirs = "{repository}:{tag}".format(**stock["agents"]["image"])
    return {path: text.replace(f'"{ours}"', f'"{theirs}"') for path, text in render_raw(values).items()}


def feature_paths(raw: Dict[str, str]) -> Dict[str, Any]:
    """Code paths the chart picks by Agent version, as they show in a render."""
    objects = [d for p, t in raw.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]
    containers = {c["name"]: c for c in agent_daemonset(objects)["spec"]["template"]["spec"]["containers"]}
    rules = [rule for o in objects if o["kind"] == "ClusterRole" for rule in o.get("rules") or []]
    system_probe = "".join(t for p, t in raw.items() if p.endswith("system-probe-configmap.yaml"))
    return {
        "trace-loader": containers["trace-agent"]["command"][0] == "trace-loader",
        "system-probe": "system-probe" in containers,
        "process-agent flag": [a.split("=")[0] for a in containers.get("process-agent", {}).get("command", [])[1:]],
        "ksm controllerrevisions": any("controllerrevisions" in rule.get("resources", []) for rule in rules),
        "cnm direct send": re.findall(r"\bdirect_send: (\w+)", system_probe),
    }


@pytest.mark.parametrize("features", [{}, FEATURES], ids=["values-file", "many-features"])
@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_the_chart_reads_our_tag_as_the_stock_agent_release(path, features):
    """Every template, every feature: the render with our image equals the stock Agent's but for
    the image name."""
    values = merge_values(features, values_of(path))
    stock = stock_image_values(values)
    assert normalized(values, stock) == render_raw(stock)


# Other ways to name the image: the features rendered, and the paths each takes that the stock
# release does not.
OTHER_TAGS = {
    # The whole tag in agents.image.tag: semver reads -gpumon0.2.0 as a pre-release, which
    # constraints without a pre-release part (">=7.72.0", "^7.36.0") reject.
    "full-tag": ({"tag": "7.81.1-gpumon0.2.0"}, FEATURES, ["process-agent flag", "ksm controllerrevisions"]),
    # doNotCheckTag makes the chart assume an old Agent in some places and a new one in others.
    "full-tag-doNotCheckTag": (
        {"tag": "7.81.1-gpumon0.2.0", "doNotCheckTag": True},
        FEATURES,
        ["trace-loader", "process-agent flag", "cnm direct send"],
    ),
    # The tag this project used before, read as Agent 0.1.0 (with FEATURES the chart refuses it).
    "0.1.0-doNotCheckTag": (
        {"tag": "0.1.0", "doNotCheckTag": True},
        {},
        ["trace-loader", "system-probe", "cnm direct send"],
    ),
}


@pytest.mark.parametrize("variant", OTHER_TAGS)
def test_other_tags_take_other_paths(variant):
    image, features, differing = OTHER_TAGS[variant]
    values = merge_values(features, values_of(DATADOG_VALUES))
    other = with_image(values, repository=values["agents"]["image"]["repository"], **image)
    stock = stock_image_values(values)
    assert normalized(other, stock) != render_raw(stock)
    theirs, ours = feature_paths(render_raw(other)), feature_paths(render_raw(stock))
    assert [k for k in ours if theirs[k] != ours[k]] == differing


def test_our_tag_takes_the_same_paths_as_the_stock_release():
    values = merge_values(FEATURES, values_of(DATADOG_VALUES))
    assert feature_paths(render_raw(values)) == feature_paths(render_raw(stock_image_values(values)))


def test_the_old_tag_without_do_not_check_tag_is_refused():
    values = with_image(values_of(DATADOG_VALUES), repository="registry.example.com/datadog-agent-gpu", tag="0.1.0")
    with pytest.raises(helm.HelmRenderError, match=r"requires an agent image 7\.36\.0 or greater"):
        render_raw(values)


# --- where agents.volumeMounts goes -------------------------------------------------------------


def test_the_chart_has_no_volume_mounts_of_the_agent_container_alone():
    containers = datadog_chart_defaults()["agents"]["containers"]
    assert "volumeMounts" not in containers["agent"]
    # Some containers have one, so the absence is not a naming difference.
    assert "volumeMounts" in containers["otelAgent"]
    # And the chart ignores one set anyway.
    values = values_of(DATADOG_VALUES)
    per_container = {"agents": {"containers": {"agent": {"volumeMounts": values["agents"]["volumeMounts"]}}}}
    ignored = merge_values(values, per_container)
    assert render_raw(ignored) == render_raw(values)


def test_the_socket_mount_reaches_every_agent_container_read_only_and_alone_at_its_path():
    values = merge_values(FEATURES, values_of(DATADOG_VALUES))
    r = Render(values, render_datadog(values))
    (declared,) = values["agents"]["volumeMounts"]
    path = declared["mountPath"]
    assert set(r.containers) == {
        "agent",
        "trace-agent",
        "process-agent",
        "system-probe",
        "security-agent",
        "otel-agent",
        "host-profiler",
        "agent-data-plane",
        "private-action-runner",
    }
    for name, container in r.containers.items():
        assert declared in container["volumeMounts"], name
        # No chart mount at, above or below the socket directory: the mount neither hides nor is
        # hidden by anything these containers use.
        for mount in container["volumeMounts"]:
            if mount is declared or mount == declared:
                continue
            other = mount["mountPath"].rstrip("/")
            assert not (other == path or path.startswith(other + "/") or other.startswith(path + "/")), (name, other)
    for name, container in r.init_containers.items():
        assert declared not in container.get("volumeMounts", []), name
