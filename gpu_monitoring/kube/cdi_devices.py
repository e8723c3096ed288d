"""The device a DRA claim holds, read back from the CDI device names a kubelet before 1.31 reports.

Before Kubernetes 1.31 pod-resources gives a DRA claim's devices only as the fully qualified CDI
names the driver returned (`<vendor>/<class>=<name>`, CDI SPEC.md). NVIDIA's GPU driver
(NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/cdi.go) qualifies them with the vendor
`k8s.` + its driver name and puts its own device name last:

    k8s.gpu.nvidia.com/claim=<claim UID>-<device>   every release since the 1.31 rework
    k8s.gpu.nvidia.com/device=<device>              beside it, in releases of 2024-09 to 2025-07

Its classic releases (driver `gpu.resource.nvidia.com`, Kubernetes 1.26-1.30) name a claim's
devices only by the claim (`k8s.gpu.resource.nvidia.com/claim=<claim UID>`, plus the edits every
claim gets, `.../claim=common`): nothing there says which GPU it holds.
"""

import re
from typing import Optional, Tuple

GPU_DRIVER = "gpu.nvidia.com"
# NVIDIA/k8s-dra-driver before its 1.31 rework: api/nvidia.com/resource/gpu/v1alpha1 GroupName.
CLASSIC_GPU_DRIVER = "gpu.resource.nvidia.com"
_NVIDIA_VENDORS = {f"k8s.{GPU_DRIVER}": GPU_DRIVER, f"k8s.{CLASSIC_GPU_DRIVER}": CLASSIC_GPU_DRIVER}
# Edits every claim of the classic driver carries (its cdiCommonDeviceName): no device.
_COMMON = "common"

_QUALIFIED = re.compile(r"(?P<vendor>[^/=]+)/(?P<kind>[^/=]+)=(?P<name>.+)")
# Kubernetes object UIDs are RFC 4122 UUIDs in their 36-character text form.
_CLAIM_DEVICE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-(?P<device>.+)")


class UnmappedName(ValueError):
    """A CDI name of NVIDIA's GPU driver that names no device."""


def device_of(cdi_name: str) -> Optional[Tuple[str, str]]:
    """(driver, device name) of a CDI name NVIDIA's GPU driver wrote; None for another driver's name
    or the classic driver's common edits. Raises UnmappedName for one of its names that holds no
    device name (the classic driver's, or a shape it never wrote)."""
    match = _QUALIFIED.fullmatch(cdi_name)
    if match is None:
        raise UnmappedName(f"{cdi_name!r} is no qualified CDI device name (vendor/class=name)")
    driver = _NVIDIA_VENDORS.get(match["vendor"])
    if driver is None:
        return None
    kind, name = match["kind"], match["name"]
    if driver == CLASSIC_GPU_DRIVER and name == _COMMON:
        return None
    if driver == GPU_DRIVER and kind == "device":
        return driver, name
    claimed = _CLAIM_DEVICE.fullmatch(name) if driver == GPU_DRIVER and kind == "claim" else None
    if claimed is None:
        raise UnmappedName(f"CDI device {cdi_name!r} of NVIDIA's DRA driver names no GPU (only NVIDIA's "
                           "k8s.gpu.nvidia.com/claim=<claim UID>-<device> and k8s.gpu.nvidia.com/device=<device> do)")
    return driver, claimed["device"]
