"""The device IDs the kubelet reports for NVIDIA GPUs, parsed into what they point at.

The NVIDIA device plugin names devices by NVML UUID (`GPU-<uuid>`, `MIG-<uuid>`, or the legacy
`MIG-GPU-<uuid>/<gi>/<ci>` of drivers before R470) and appends `::<n>` to each replica when a GPU
is shared by time-slicing or MPS. GKE's own plugin names them by device node minor instead
(`nvidia<N>`, `nvidia<N>/vgpu<k>` for time-sharing, `nvidia<N>/gi<M>` for MIG).
"""

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable, Optional

DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")

# Hex groups joined by dashes: every NVML UUID, without insisting on the 8-4-4-4-12 layout.
_HEX_UUID = r"[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)*"

_SHAPES = (
    # A shared MIG instance carries the replica suffix too (`nvidia.com/mig-1g.10gb.shared`).
    re.compile(rf"(?P<uuid>(?:GPU|MIG)-{_HEX_UUID})(?:::(?P<replica>[0-9]+))?"),
    re.compile(rf"MIG-(?P<uuid>GPU-{_HEX_UUID})/(?P<gpu_instance>[0-9]+)/(?P<compute_instance>[0-9]+)"),
    re.compile(r"nvidia(?P<minor>[0-9]+)(?:/vgpu(?P<vgpu>[0-9]+)|/gi(?P<gpu_instance>[0-9]+))?"),
)

_EXPECTED = "GPU-<uuid>[::<n>], MIG-<uuid>[::<n>], MIG-GPU-<uuid>/<gi>/<ci>, nvidia<N>[/vgpu<k>|/gi<M>]"


@dataclass(frozen=True)
class DeviceRef:
    """What one device ID names. `uuid` is the NVML UUID with its `GPU-`/`MIG-` prefix; `minor` is
    the device node minor (`/dev/nvidia<N>`, NVML's minor number), which need not equal the NVML index."""

    raw: str
    uuid: Optional[str] = None
    replica: Optional[int] = None
    minor: Optional[int] = None
    vgpu: Optional[int] = None
    gpu_instance: Optional[int] = None
    compute_instance: Optional[int] = None


def parse_device_id(raw: str) -> DeviceRef:
    """Parse one kubelet device ID; an ID of no known shape raises ValueError naming it."""
    for shape in _SHAPES:
        match = shape.fullmatch(raw)
        if match:
            parts = {key: value for key, value in match.groupdict().items() if value is not None}
            numbers = {key: int(value) for key, value in parts.items() if key != "uuid"}
            return DeviceRef(raw=raw, uuid=parts.get("uuid"), **numbers)
    raise ValueError(f"unrecognised NVIDIA device ID {raw!r}; expected one of {_EXPECTED}")


def matches_resource(name: str, patterns: Iterable[str]) -> bool:
    """Whether a resource name matches any glob (`nvidia.com/mig-*`); case-sensitive like Kubernetes."""
    return any(fnmatchcase(name, pattern) for pattern in patterns)
