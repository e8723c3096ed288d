"""A GPU's registration with its NVLink fabric (NVSwitch systems: HGX/DGX, NVL72 racks):
nvmlDeviceGetGpuFabricInfoV, and what its answer means in plain values.

The health mask packs fields (nvml.h's NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_* and _WIDTH_*): two-bit
flags, 0 the driver does not report it, 1 true, 2 false; and the four-bit INCORRECT_CONFIGURATION,
0 not reported, 1 none, 2 to 8 what the fabric finds wrong with the GPU (CUDA 13's nvml.h; NVML's
change log adds a status with R595, and 8, GPU state invalid, is the one older headers lack; on it
the driver also asks for drain and reset through its recovery action, as NVIDIA's open GPU kernel
modules' fabric probe shows). A configuration fault joins a failed registration in `errors`, in
words. A value outside an enum is left out and named as untrusted.

PARTITION_ASSIGNED (bits 12-13, R595) is not read: whether the fabric manager put the GPU in a
partition is how the operator set the fabric up, not a fault (a partitioned NVSwitch system keeps
GPUs outside any partition while they are not lent), and a GPU that needs a partition and has none
already shows as not registered or as an incorrect configuration.
"""

import ctypes
import uuid
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import pynvml

from gpu_monitoring.nvml import library
from gpu_monitoring.nvml.library import Query, versioned

NOT_SUPPORTED = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
COMPLETED = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
STATES = range(NOT_SUPPORTED, COMPLETED + 1)
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
NO_CLUSTER = str(uuid.UUID(int=0))


class FabricStatus(NamedTuple):
    """A GPU's NVLink fabric registration, decoded. `supported` is False where the GPU has no fabric to
    register with (state NOT_SUPPORTED), which holds until the driver is loaded again; then nothing
    else is told. A value NVML does not define is None (a flag: absent) and named in `untrusted`."""

    supported: bool
    state: Optional[int]  # NVML_GPU_FABRIC_STATE_*: 1 not started, 2 in progress, 3 completed
    clique_id: Optional[int]  # where registration completed into a cluster
    cluster_uuid: Optional[str]
    errors: Tuple[str, ...]  # what keeps the GPU from its fabric, in words
    flags: Dict[str, int]  # each health flag (MASK) the driver reports: 1 true, 0 false
    summary: Optional[int]  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*: 1 healthy, 2 unhealthy, 3 limited capacity
    untrusted: Tuple[str, ...]


_UNSUPPORTED = FabricStatus(False, None, None, None, (), {}, None, ())


def decode(state: int, status: int, clique_id: int, cluster_uuid: str, health_mask: int,
           health_summary: Optional[int]) -> FabricStatus:
    """The answer's fields as the structure gives them (`status` an nvmlReturn_t, meaningful once the
    state is COMPLETED; `health_summary` None where the driver knows only v2, before R580)."""
    if state == NOT_SUPPORTED:
        return _UNSUPPORTED
    untrusted: List[str] = []
    if state not in STATES:
        untrusted.append(f"registration state {state}")
    # A zero cluster UUID names no cluster: nothing to group the GPU's series by.
    in_cluster = state == COMPLETED and cluster_uuid != NO_CLUSTER
    errors = _errors(state, status, health_mask, untrusted)
    flags = {}
    for name, (shift, true) in MASK.items():
        flag = health_mask >> shift & _FLAG_BITS
        if flag in (true, _FALSE):
            flags[name] = int(flag == true)
        elif flag != _NOT_REPORTED:
            untrusted.append(f"health flag {name.replace('_', ' ')} {flag}")
    summary = health_summary if health_summary in SUMMARIES else None
    if summary is None and health_summary not in (None, pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED):
        untrusted.append(f"health summary {health_summary}")
    return FabricStatus(True, state if state in STATES else None, clique_id if in_cluster else None,
                        cluster_uuid if in_cluster else None, errors, flags, summary, tuple(untrusted))


def _errors(state: int, status: int, health_mask: int, untrusted: List[str]) -> Tuple[str, ...]:
    """What keeps the GPU from its fabric, in words: a registration that completed with a failure, a
    configuration the fabric finds incorrect."""
    errors = []
    if state == COMPLETED and status != library.SUCCESS:
        errors.append(f"registration failed ({library.describe(status)})")
    configuration = health_mask >> CONFIGURATION_SHIFT & _CONFIGURATION_BITS
    if configuration in CONFIGURATION_FAULTS:
        errors.append(f"configuration incorrect ({CONFIGURATION_FAULTS[configuration]})")
    elif configuration not in _CONFIGURATION_FINE:
        untrusted.append(f"health field incorrect configuration {configuration}")
    return tuple(errors)


def _layout(summary: bool) -> type:
    """nvmlGpuFabricInfo_v2_t, or _v3_t with the health summary, as CUDA 13's nvml.h lays them out.
    Not pynvml's classes: they declare the state (nvmlGpuFabricState_t, an unsigned char in nvml.h)
    as an unsigned int, whose three upper bytes are padding the driver need not clear."""
    fields = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * pynvml.NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_int),  # an nvmlReturn_t
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
        ("healthMask", ctypes.c_uint),
    ]
    return type(f"nvmlGpuFabricInfo_v{3 if summary else 2}_t", (ctypes.Structure,),
                {"_fields_": fields + ([("healthSummary", ctypes.c_ubyte)] if summary else [])})


def _answer(info: Any) -> FabricStatus:
    return decode(info.state, info.status, info.cliqueId, str(uuid.UUID(bytes=bytes(info.clusterUuid))),
                  info.healthMask, getattr(info, "healthSummary", None))


def _query(version: int, summary: bool) -> Query:
    layout = _layout(summary)
    # nvml.h's NVML_STRUCT_VERSION: the structure's size in the low bytes, its version in the top one.
    assert ctypes.sizeof(layout) == version & 0xFFFFFF, f"{layout.__name__} is not laid out as nvml.h says"
    return Query("nvmlDeviceGetGpuFabricInfoV", [layout], _answer, prepare=versioned(version),
                 key_args=(version >> 24,))


# v3 (R580 on) first; R550 to R575 know v2 only and answer v3 ARGUMENT_VERSION_MISMATCH, once.
QUERIES = (_query(pynvml.nvmlGpuFabricInfo_v3, True), _query(pynvml.nvmlGpuFabricInfo_v2, False))
