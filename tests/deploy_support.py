"""What the tests of deploy/ share: its paths; the sidecar Helm chart, rendered by Helm's own Go
engine (helm-python-sdk, no helm binary, no cluster, no network), and the parts of what it renders
that other deployment files must agree with; validation against the Kubernetes JSON schemas
(kubernetes-validate)."""

import posixpath
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import kubernetes_validate
import pytest
import yaml

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


def chart_values() -> Dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def chart_socket_path() -> str:
    sidecar = chart_values()["sidecar"]
    return posixpath.join(sidecar["socketDir"], sidecar["socketName"])


def render_raw(values: Optional[Dict[str, Any]] = None) -> Dict[str, str]:
    with helm.Chart.load(CHART) as chart:
        return chart.render(values or {}, name="gpu", namespace="monitoring")


def render(values: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    objects = []
    for path, text in sorted(render_raw(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def daemonset(values: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    (found,) = [obj for obj in render(values) if obj["kind"] == "DaemonSet"]
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
