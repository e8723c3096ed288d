"""What the tests of deploy/ share: its paths; the sidecar Helm chart, rendered by Helm's own Go
engine (helm-python-sdk, no helm binary, no cluster, no network), and the parts of what it renders
that other deployment files must agree with; validation against the Kubernetes JSON schemas
(kubernetes-validate); the Dockerfiles' instructions; the official Datadog chart, rendered the same
way from its vendored copy."""

import copy
import json
import posixpath
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import kubernetes_validate
import pytest
import yaml

from gpu_monitoring.node import boot, driver_gpus, infiniband, pci

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "gpu-monitoring-sidecar"

# The dev extra installs helm-python-sdk only where it has wheels for this Python (3.10+).
if sys.version_info >= (3, 10):
    import helm_python as helm
else:  # pragma: no cover
    helm = None
needs_helm = pytest.mark.skipif(helm is None, reason="helm-python-sdk needs Python 3.10+")

# The oldest Kubernetes the chart claims (Chart.yaml kubeVersion) would be 1.25; validate against
# a common production version and the newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
POD_RESOURCES_HOST_DIR = "/var/lib/kubelet/pod-resources"
# What the check and the sidecar read below their sysfs root and below their proc root besides the
# processes: what each deployment must leave readable.
SYSFS_READS = (pci.DEVICES_DIRECTORY, infiniband.INFINIBAND_DIRECTORY)
PROC_READS = (boot.BOOT_ID, driver_gpus.GPUS_DIRECTORY)


def chart_values() -> Dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def chart_socket_path() -> str:
    sidecar = chart_values()["sidecar"]
    return posixpath.join(sidecar["socketDir"], sidecar["socketName"])


def render_raw(values: Optional[Dict[str, Any]] = None, kube_version: Optional[str] = None) -> Dict[str, str]:
    """The chart's templates as `helm template` renders them; for the cluster version `kube_version`
    ("v1.29.0", `--kube-version`) where given, else for the Kubernetes release Helm was built with."""
    release = {"name": "gpu", "namespace": "monitoring"}
    with helm.Chart.load(CHART) as chart:
        if kube_version is None:
            return chart.render(values or {}, **release)
        # Chart.render passes no kube_version through; the native render it calls takes one.
        options = json.dumps(dict(release, kube_version=kube_version))
        return json.loads(helm._native.call_string("helm_render", chart._raw(), json.dumps(values or {}), options))


def render(values: Optional[Dict[str, Any]] = None, kube_version: Optional[str] = None) -> List[Dict[str, Any]]:
    objects = []
    for path, text in sorted(render_raw(values, kube_version).items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def daemonset(values: Optional[Dict[str, Any]] = None, kube_version: Optional[str] = None) -> Dict[str, Any]:
    (found,) = [obj for obj in render(values, kube_version) if obj["kind"] == "DaemonSet"]
    return found


def pod_spec(ds: Dict[str, Any]) -> Dict[str, Any]:
    return ds["spec"]["template"]["spec"]


def sidecar_container(ds: Dict[str, Any]) -> Dict[str, Any]:
    (found,) = [c for c in pod_spec(ds)["containers"] if c["name"] == "sidecar"]
    return found


def options(args: List[str]) -> Dict[str, str]:
    """`--name value` pairs of a container's args."""
    pairs = {}
    for i, arg in enumerate(args):
        if arg.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs[arg] = args[i + 1]
    return pairs


def validate(obj: Dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = "/".join(str(p) for p in error.path)
        pytest.fail(f"{obj['kind']} {obj.get('metadata', {}).get('name')}: {path}: {error.message}")


# --- Dockerfiles ---------------------------------------------------------------------------------

AGENT_DOCKERFILE = DEPLOY / "docker" / "agent.Dockerfile"
SIDECAR_DOCKERFILE = DEPLOY / "docker" / "sidecar.Dockerfile"


def dockerfile(path: Path) -> List[Tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    instructions = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, f"{path.name} ends inside a continued line"
    return instructions


def dockerfile_args(path: Path) -> Dict[str, str]:
    """Default of each `ARG NAME=default` in a Dockerfile."""
    defaults = {}
    for keyword, rest in dockerfile(path):
        if keyword == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            defaults[name.strip()] = default.strip().strip('"')
    return defaults


# --- The official Datadog chart ------------------------------------------------------------------

# A read-only copy of charts/datadog beside the repository (see ../shared/vendor/README.md). It is
# third-party code: the tests read it where it is and never copy it into the project. Its
# kube-state-metrics and datadog-crds subcharts are not there; Helm renders without them.
DATADOG_CHART = ROOT.parent / "shared" / "vendor" / "datadog-chart"
needs_datadog_chart = pytest.mark.skipif(
    helm is None or not DATADOG_CHART.is_dir(),
    reason=f"needs helm-python-sdk and the official Datadog chart at {DATADOG_CHART}",
)

DATADOG_VALUES = DEPLOY / "helm" / "datadog-values.yaml"
DATADOG_VALUES_LOCAL = DEPLOY / "helm" / "datadog-values-local.yaml"

# What an install must give the chart besides our values files: an API key (a dummy), and no
# kube-state-metrics subchart (it is not in the vendored copy; the Agent's own KSM core check stays).
DATADOG_CHART_REQUIRED: Dict[str, Any] = {"datadog": {"apiKey": "0" * 32, "kubeStateMetricsEnabled": False}}
# Fixes the chart's only random output (the Cluster Agent token and the KPI install id and time), so
# that two renders can be compared line by line.
DATADOG_CHART_DETERMINISTIC: Dict[str, Any] = {
    "clusterAgent": {"token": "0123456789abcdef0123456789abcdef"},
    "datadog": {"apm": {"instrumentation": {"skipKPITelemetry": True}}},
}
DATADOG_RELEASE = "datadog"


def merge_values(*layers: Dict[str, Any]) -> Dict[str, Any]:
    """Layers merged the way `helm install -f a.yaml -f b.yaml` does: maps merge key by key, any
    other value (lists included) is replaced by the later layer's."""
    merged: Dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = merge_values(merged[key], value)
            else:
                merged[key] = copy.deepcopy(value)
    return merged


def datadog_chart_defaults() -> Dict[str, Any]:
    with helm.Chart.load(DATADOG_CHART) as chart:
        return chart.values


def render_datadog_raw(values: Dict[str, Any]) -> Dict[str, str]:
    """The official chart's templates, rendered offline with the required values under `values`."""
    with helm.Chart.load(DATADOG_CHART) as chart:
        return chart.render(merge_values(DATADOG_CHART_REQUIRED, values), name=DATADOG_RELEASE, namespace="datadog")


def render_datadog(values: Dict[str, Any]) -> List[Dict[str, Any]]:
    objects = []
    for path, text in sorted(render_datadog_raw(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def agent_daemonset(objects: List[Dict[str, Any]]) -> Dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == DATADOG_RELEASE]
    return found
