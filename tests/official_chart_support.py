"""The official Datadog chart's renders of this project's values files, shared by the tests of what
each key does (test_official_chart.py) and of the image tag and mounts (test_official_chart_image.py)."""

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import yaml

from .deploy_support import (
    DATADOG_CHART,
    DATADOG_CHART_DETERMINISTIC,
    DATADOG_VALUES,
    DATADOG_VALUES_LOCAL,
    ROOT,
    agent_daemonset,
    helm,
    merge_values,
    render_datadog,
    render_datadog_raw,
)

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


@cache
def values_file_renders() -> Dict[Path, Render]:
    """Each values file as the chart renders it, once per session."""
    return {path: Render(values_of(path), render_datadog(values_of(path))) for path in VALUES_FILES}


def overlapping_mounts(container: Dict[str, Any], declared: Dict[str, Any]) -> List[str]:
    """The paths of the container's other mounts at, above or below `declared`'s: a mount there hides,
    or is hidden by, part of the other."""
    path = declared["mountPath"].rstrip("/")
    others = [m["mountPath"].rstrip("/") for m in container.get("volumeMounts", []) if m != declared]
    return [o for o in others if o == path or path.startswith(o + "/") or o.startswith(path + "/")]


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


def skipped_for_want_of_the_chart(skip_reasons: Iterable[str]) -> Optional[str]:
    """One line for the end of pytest's summary when tests skipped for want of the official chart: how
    many, why, and where to put it. None when none did."""
    count = sum(str(DATADOG_CHART) in reason for reason in skip_reasons)
    if not count:
        return None
    where = DATADOG_CHART.relative_to(ROOT.parent)
    missing = ("helm-python-sdk is not installed (Python 3.10+, the dev extra)" if helm is None else
               f"the official Datadog chart is not at ../{where} (beside this clone)")
    tests = f"{count} test{'s' if count > 1 else ''}"
    return (f"{tests} of the official Datadog chart SKIPPED: {missing}. Put DataDog/helm-charts' charts/datadog, "
            f"at the version README.md's helm commands pin, at {DATADOG_CHART}: README.md, 'Kubernetes', says how.")
