"""What the kubelet's `/pods` says about this node's pods and containers, validated where it enters:
a field of the wrong type costs its pod, named with the field, never the list nor a failure far
from here."""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

from gpu_monitoring.snapshot import json_typed

TERMINAL_PHASES = ("Succeeded", "Failed")
GPU_RESOURCE_PREFIX = "nvidia.com/"


@dataclass(frozen=True)
class ContainerPort:
    container_port: int
    name: Optional[str] = None


@dataclass(frozen=True)
class ContainerInfo:
    name: str
    container_id: Optional[str]
    env: Dict[str, str] = field(default_factory=dict)
    gpu_limits: Dict[str, str] = field(default_factory=dict)
    image: str = ""
    ports: List[ContainerPort] = field(default_factory=list)


@dataclass(frozen=True)
class PodInfo:
    uid: str
    name: str
    namespace: str
    phase: str
    containers: List[ContainerInfo] = field(default_factory=list)
    labels: Dict[str, str] = field(default_factory=dict)
    pod_ip: Optional[str] = None
    # The pod's Ready condition is True: every container is ready to serve.
    ready: bool = False
    # The kind of the pod's controlling owner (`DaemonSet`, `ReplicaSet`, `Job`…), None for a bare pod.
    controller_kind: Optional[str] = None

    @property
    def terminal(self) -> bool:
        """Succeeded or Failed: its devices are free again even if pod-resources still lists them."""
        return self.phase in TERMINAL_PHASES


def parse_pod_list(payload: Any) -> List[PodInfo]:
    """PodInfo for every pod of a `/pods` answer that reads as one (`read_pod` says why another does
    not); ValueError when the answer is no pod list at all."""
    pods = (read_pod(item, i) for i, item in enumerate(pod_list_items(payload)))
    return [pod for pod in pods if isinstance(pod, PodInfo)]


def pod_list_items(payload: Any) -> List[Any]:
    """The answer's `items`; ValueError when it is not an object with an `items` array."""
    return _required(json_typed(dict, payload, "the answer"), "items", list, "the answer")


def read_pod(item: Any, index: int) -> Union[PodInfo, str]:
    """The pod `items[index]` describes, or why it is skipped: the pod (its namespace/name, else its
    index) and the field of the wrong type."""
    try:
        return _pod(json_typed(dict, item, "it"))
    except ValueError as e:
        return f"kubelet pod {_label(item, index)} is skipped: {e}"


def _label(item: Any, index: int) -> str:
    """namespace/name when the item has them as strings, else its place in the list."""
    metadata = item.get("metadata") if isinstance(item, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str):
        return f"items[{index}]"
    namespace = metadata.get("namespace")
    return f"{namespace}/{name}" if isinstance(namespace, str) else name


def _pod(item: Dict[str, Any]) -> PodInfo:
    metadata = _required(item, "metadata", dict, "")
    spec = _optional(item, "spec", dict, "", {})
    status = _optional(item, "status", dict, "", {})
    ids = _container_ids(_optional(status, "containerStatuses", list, "status", []), "status")
    containers = _optional(spec, "containers", list, "spec", [])
    return PodInfo(
        uid=_required(metadata, "uid", str, "metadata"),
        name=_required(metadata, "name", str, "metadata"),
        namespace=_optional(metadata, "namespace", str, "metadata", ""),
        phase=_optional(status, "phase", str, "status", "Unknown"),
        containers=[_container(c, f"spec.containers[{i}]", ids) for i, c in enumerate(containers)],
        labels=_strings(_optional(metadata, "labels", dict, "metadata", {}), "metadata.labels"),
        pod_ip=_optional(status, "podIP", str, "status", None),
        ready=_ready(_optional(status, "conditions", list, "status", []), "status.conditions"),
        controller_kind=_controller_kind(
            _optional(metadata, "ownerReferences", list, "metadata", []), "metadata.ownerReferences"
        ),
    )


def _controller_kind(owners: List[Any], where: str) -> Optional[str]:
    """The owner reference marked `controller: true` (at most one, by the API's rules)."""
    for i, owner in enumerate(owners):
        owner = json_typed(dict, owner, f"{where}[{i}]")
        if _optional(owner, "controller", bool, f"{where}[{i}]", False):
            return _required(owner, "kind", str, f"{where}[{i}]")
    return None


def _ready(conditions: List[Any], where: str) -> bool:
    for i, condition in enumerate(conditions):
        condition = json_typed(dict, condition, f"{where}[{i}]")
        if condition.get("type") == "Ready":
            return _optional(condition, "status", str, f"{where}[{i}]", "") == "True"
    return False


def _strings(values: Mapping[str, Any], where: str) -> Dict[str, str]:
    return {k: json_typed(str, v, f"{where}[{k!r}]") for k, v in values.items()}


def _container_ids(statuses: List[Any], where: str) -> Dict[str, Optional[str]]:
    ids = {}
    for i, status in enumerate(statuses):
        here = f"{where}.containerStatuses[{i}]"
        status = json_typed(dict, status, here)
        ids[_required(status, "name", str, here)] = _strip_runtime(_optional(status, "containerID", str, here, None))
    return ids


def _container(spec: Any, where: str, ids: Mapping[str, Optional[str]]) -> ContainerInfo:
    spec = json_typed(dict, spec, where)
    name = _required(spec, "name", str, where)
    resources = _optional(spec, "resources", dict, where, {})
    limits = _optional(resources, "limits", dict, f"{where}.resources", {})
    env = _optional(spec, "env", list, where, [])
    ports = _optional(spec, "ports", list, where, [])
    return ContainerInfo(
        name=name,
        container_id=ids.get(name),
        env=_env(env, f"{where}.env"),
        gpu_limits={
            k: str(json_typed((str, int, float), v, f"{where}.resources.limits[{k!r}]"))
            for k, v in limits.items()
            if k.startswith(GPU_RESOURCE_PREFIX)
        },
        image=_optional(spec, "image", str, where, ""),
        ports=[_port(p, f"{where}.ports[{i}]") for i, p in enumerate(ports)],
    )


def _port(spec: Any, where: str) -> ContainerPort:
    spec = json_typed(dict, spec, where)
    return ContainerPort(
        container_port=_required(spec, "containerPort", int, where), name=_optional(spec, "name", str, where, None)
    )


def _env(entries: List[Any], where: str) -> Dict[str, str]:
    env = {}
    for i, entry in enumerate(entries):
        entry = json_typed(dict, entry, f"{where}[{i}]")
        # `valueFrom` values are not in the spec.
        if "valueFrom" not in entry:
            # The API leaves out `value` when it is the empty string.
            env[_required(entry, "name", str, f"{where}[{i}]")] = _optional(entry, "value", str, f"{where}[{i}]", "")
    return env


def _required(parent: Mapping[str, Any], key: str, kind: Any, where: str) -> Any:
    if parent.get(key) is None:
        raise ValueError(f"{where} has no `{key}`" if where else f"it has no `{key}`")
    return json_typed(kind, parent[key], _at(where, key))


def _optional(parent: Mapping[str, Any], key: str, kind: Any, where: str, default: Any) -> Any:
    value = parent.get(key)
    return default if value is None else json_typed(kind, value, _at(where, key))


def _at(where: str, key: str) -> str:
    """The field's path from the pod (or from the answer, for `items`)."""
    return f"{where}.{key}" if where else key


def _strip_runtime(container_id: Optional[str]) -> Optional[str]:
    """`containerd://abc` -> `abc`; the runtime prefix is not part of the ID cgroups show."""
    if not container_id:
        return None
    return container_id.split("://", 1)[-1]
