"""The device names NVIDIA's DRA driver gives GPUs and MIG devices, parsed into what they point at.

NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin: a whole GPU is `gpu-<minor>` (deviceinfo.go,
`GpuInfo.CanonicalName`, NVML's minor number); a MIG device is
`gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement start>` (mig.go,
`MigSpecTuple.ToCanonicalName`: the profile name with its dots removed, lowercased, anything but
`[a-z0-9-]` made `-`, e.g. `gpu-0-mig-1g10gb-19-0`), and before that
`gpu-<parent minor>-mig-<GI profile id>-<placement start>-<placement size>` (deviceinfo.go,
`MigDeviceInfo.CanonicalName`). The driver resolves them through NVML on the node, as we do.
"""

import re
from dataclasses import dataclass
from typing import Optional

DRIVER = "gpu.nvidia.com"

_GPU = re.compile(r"gpu-(?P<minor>[0-9]+)")
# The older scheme first: its fields are all numbers, which the newer scheme's profile never is.
_MIG_BY_SIZE = re.compile(r"gpu-(?P<minor>[0-9]+)-mig-(?P<profile_id>[0-9]+)-(?P<start>[0-9]+)-(?P<size>[0-9]+)")
_MIG_BY_PROFILE = re.compile(
    r"gpu-(?P<minor>[0-9]+)-mig-(?P<profile>[a-z0-9-]*[a-z][a-z0-9-]*)-(?P<profile_id>[0-9]+)-(?P<start>[0-9]+)"
)
_EXPECTED = "gpu-<minor>, gpu-<minor>-mig-<profile>-<profile id>-<start>, gpu-<minor>-mig-<profile id>-<start>-<size>"
_NOT_IN_NAME = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class DraDeviceRef:
    """What one DRA device name names: a GPU by its minor number, or one of its MIG devices by GPU
    instance profile (its name in the newer scheme; its NVML ID in both) and placement."""

    raw: str
    minor: int
    mig: bool = False
    profile: Optional[str] = None  # as the name writes it: `1g10gb`
    profile_id: Optional[int] = None
    placement_start: Optional[int] = None
    placement_size: Optional[int] = None


def parse_dra_name(raw: str) -> DraDeviceRef:
    """Parse one device name of driver gpu.nvidia.com; a name of no known shape raises ValueError naming it."""
    match = _GPU.fullmatch(raw)
    if match:
        return DraDeviceRef(raw=raw, minor=int(match["minor"]))
    for shape in (_MIG_BY_SIZE, _MIG_BY_PROFILE):
        match = shape.fullmatch(raw)
        if match:
            parts = match.groupdict()
            return DraDeviceRef(
                raw=raw,
                minor=int(parts["minor"]),
                mig=True,
                profile=parts.get("profile"),
                profile_id=int(parts["profile_id"]),
                placement_start=int(parts["start"]),
                placement_size=int(parts["size"]) if parts.get("size") else None,
            )
    raise ValueError(f"unrecognised {DRIVER} device name {raw!r}; expected one of {_EXPECTED}")


def profile_in_name(profile: str) -> str:
    """A MIG profile as the driver writes it in a device name: `1g.10gb+me` -> `1g10gb-me`."""
    return _NOT_IN_NAME.sub("-", profile.replace(".", "").lower()).strip("-")
