"""This node's dcgm-exporter, found in the kubelet's pod list (which holds this node's pods only).

The NVIDIA GPU Operator runs it as the DaemonSet `nvidia-dcgm-exporter` (label
`app=nvidia-dcgm-exporter`, or `app=nvidia-dcgm-exporter-dra` with DRA), dcgm-exporter's own Helm
chart with `app.kubernetes.io/name=dcgm-exporter`; a pod deployed otherwise is known by its image.
It listens on the pod's IP, port 9400 unless its container port named `metrics` says otherwise.
"""

from typing import Iterable, Optional

from gpu_monitoring.kube.pod_list import ContainerInfo, PodInfo

LABELS = (
    ("app", "nvidia-dcgm-exporter"),
    ("app", "nvidia-dcgm-exporter-dra"),
    ("app.kubernetes.io/name", "dcgm-exporter"),
)
IMAGE = "dcgm-exporter"
DEFAULT_PORT = 9400
PORT_NAME = "metrics"


def exporter_url(pods: Iterable[PodInfo]) -> Optional[str]:
    """The `/metrics` URL of a Running, Ready exporter pod (the first by namespace and name), or None."""
    found = sorted((p for p in pods if _serving(p) and _is_exporter(p)), key=lambda p: (p.namespace, p.name))
    if not found:
        return None
    pod = found[0]
    host = f"[{pod.pod_ip}]" if ":" in pod.pod_ip else pod.pod_ip
    return f"http://{host}:{_port(pod.containers)}/metrics"


def _serving(pod: PodInfo) -> bool:
    return pod.phase == "Running" and pod.ready and bool(pod.pod_ip)


def _is_exporter(pod: PodInfo) -> bool:
    return any(pod.labels.get(key) == value for key, value in LABELS) or any(IMAGE in c.image for c in pod.containers)


def _port(containers: Iterable[ContainerInfo]) -> int:
    ports = [p for c in containers for p in c.ports]
    named = [p.container_port for p in ports if p.name == PORT_NAME]
    return named[0] if named else DEFAULT_PORT
