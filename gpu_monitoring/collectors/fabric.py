"""A GPU's registration with its NVLink fabric (NVSwitch systems: HGX/DGX, NVL72 racks), one
nvmlDeviceGetGpuFabricInfoV call a run where the driver answers it.

The health mask packs fields (nvml.h's NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_* and _WIDTH_*): two-bit
flags, 0 the driver does not report it, 1 true, 2 false; and the four-bit INCORRECT_CONFIGURATION,
0 not reported, 1 none, 2 to 8 what the fabric finds wrong with the GPU (CUDA 13's nvml.h; NVML's
change log adds a status with R595, and 8, GPU state invalid, is the one older headers lack; on it
the driver also asks for drain and reset through its recovery action, as NVIDIA's open GPU kernel
modules' fabric probe shows). A configuration fault joins a failed registration in `fabric_error`,
in words. A value outside an enum is left out and named as untrusted.

PARTITION_ASSIGNED (bits 12-13, R595) is not read: whether the fabric manager put the GPU in a
partition is how the operator set the fabric up, not a fault (a partitioned NVSwitch system keeps
GPUs outside any partition while they are not lent), and a GPU that needs a partition and has none
already shows as not registered or as an incorrect configuration.
"""

import uuid
from typing import Dict, List, Set, Tuple

import pynvml

from gpu_monitoring.collectors.base import Collector, Fields
from gpu_monitoring.collectors.series import SeriesValue, fact, gauge
from gpu_monitoring.nvml import library
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.queries import FabricInfo

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
CONFIGURATION_SHIFT = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION
_CONFIGURATION_BITS = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_INCORRECT_CONFIGURATION
_CONFIGURATION_FINE = (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NOT_SUPPORTED,
                       pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE)
# What each INCORRECT_CONFIGURATION value finds wrong, in words (nvml.h's names for 2 to 8).
CONFIGURATION_FAULTS = {
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_SYSGUID: "wrong system GUID",
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_CHASSIS_SN: "wrong chassis serial number",
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NO_PARTITION: "no fabric partition",
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS: "too few NVLinks",
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCOMPATIBLE_GPU_FW: "GPU firmware incompatible "
                                                                                    "with the fabric",
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INVALID_LOCATION: "invalid GPU location",
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_GPU_STATE_INVALID: "GPU state invalid",
}
CLIQUE_ID, CLUSTER_UUID = fact("fabric_clique_id"), fact("fabric_cluster_uuid")
NO_CLUSTER = str(uuid.UUID(int=0))
ERROR, UNTRUSTED = fact("fabric_error"), fact("fabric_untrusted")


class Fabric(Collector):
    """A GPU whose driver answers state NOT_SUPPORTED (no NVSwitch to register with) has none until
    the driver is loaded again, which restarts NVML: it is not asked again this session."""

    name = "fabric"

    def __init__(self) -> None:
        self._without: Set[int] = set()

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
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


def _readings(info: FabricInfo) -> List[SeriesValue]:
    untrusted: List[str] = []
    found: List[SeriesValue] = []
    if info.state in STATES:
        found.append((STATE, info.state))
    else:
        untrusted.append(f"registration state {info.state}")
    # A zero cluster UUID names no cluster: nothing to group the GPU's series by.
    if info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and info.cluster_uuid != NO_CLUSTER:
        found += [(CLIQUE_ID, info.clique_id), (CLUSTER_UUID, info.cluster_uuid)]
    errors = _errors(info, untrusted)
    if errors:
        found.append((ERROR, "; ".join(errors)))
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


def _errors(info: FabricInfo, untrusted: List[str]) -> List[str]:
    """What keeps the GPU from its fabric, in words: a registration that completed with a failure, a
    configuration the fabric finds incorrect."""
    errors = []
    if info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and info.status != library.SUCCESS:
        errors.append(f"registration failed ({library.describe(info.status)})")
    configuration = info.health_mask >> CONFIGURATION_SHIFT & _CONFIGURATION_BITS
    if configuration in CONFIGURATION_FAULTS:
        errors.append(f"configuration incorrect ({CONFIGURATION_FAULTS[configuration]})")
    elif configuration not in _CONFIGURATION_FINE:
        untrusted.append(f"health field incorrect configuration {configuration}")
    return errors
