"""A GPU's registration with its NVLink fabric (NVSwitch systems: HGX/DGX, NVL72 racks), one
nvmlDeviceGetGpuFabricInfoV call a run where the driver answers it.

The health mask packs two-bit fields (nvml.h's NVML_GPU_FABRIC_HEALTH_MASK_*): 0 the driver does not
report it, 1 true, 2 false. A value outside an enum is left out and named as untrusted.
"""

import uuid
from typing import Dict, List, Set, Tuple

import pynvml

from ..nvml import library
from ..nvml.device import Device
from ..nvml.queries import FabricInfo
from .base import Collector, Fields
from .series import Reading, fact, gauge

STATE = gauge("fabric.state")
SUMMARY = gauge("fabric.health.summary")
STATES = range(pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED + 1)
SUMMARIES = range(pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
                  pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY + 1)
# Each flag of the mask: where it sits (nvml.h's SHIFT) and its TRUE value.
MASK: Dict[str, Tuple[int, int]] = {
    "degraded_bandwidth": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
                           pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE),
    "route_recovery": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY,
                       pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_TRUE),
    "route_unhealthy": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
                        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE),
    "access_timeout_recovery": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY,
                                pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_TRUE),
}
FLAGS = {name: gauge(f"fabric.health.{name}") for name in MASK}
# nvml.h's NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_* of each flag above.
_FLAG_BITS = 0x3
_NOT_REPORTED, _FALSE = 0, 2
CLIQUE_ID, CLUSTER_UUID = fact("fabric_clique_id"), fact("fabric_cluster_uuid")
NO_CLUSTER = str(uuid.UUID(int=0))
ERROR, UNTRUSTED = fact("fabric_error"), fact("fabric_untrusted")


class Fabric(Collector):
    """A GPU whose driver answers state NOT_SUPPORTED (no NVSwitch to register with) has none until
    the driver is loaded again, which restarts NVML: it is not asked again this session."""

    name = "fabric"

    def __init__(self) -> None:
        self._without: Set[int] = set()

    def collect(self, device: Device, fields: Fields) -> List[Reading]:
        if device.index in self._without:
            return []
        info = device.fabric_info()
        if info is None:
            return []
        if info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            self._without.add(device.index)  # as a driver that refuses the call: no series
            return []
        return _readings(info)

    def forget(self) -> None:
        self._without = set()


def _readings(info: FabricInfo) -> List[Reading]:
    untrusted = []
    found: List[Reading] = []
    if info.state in STATES:
        found.append((STATE, info.state))
    else:
        untrusted.append(f"registration state {info.state}")
    if info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
        # A zero cluster UUID names no cluster: nothing to group the GPU's series by.
        if info.cluster_uuid != NO_CLUSTER:
            found += [(CLIQUE_ID, info.clique_id), (CLUSTER_UUID, info.cluster_uuid)]
        if info.status != library.SUCCESS:
            found.append((ERROR, library.describe(info.status)))
    for name, (shift, true) in MASK.items():
        flag = info.health_mask >> shift & _FLAG_BITS
        if flag in (true, _FALSE):
            found.append((FLAGS[name], int(flag == true)))
        elif flag != _NOT_REPORTED:
            untrusted.append(f"health flag {name.replace('_', ' ')} {flag}")
    summary = info.health_summary
    if summary in SUMMARIES:
        found.append((SUMMARY, summary))
    elif summary not in (None, pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED):
        untrusted.append(f"health summary {summary}")
    found.append((UNTRUSTED, untrusted))
    return found
