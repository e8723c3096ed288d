"""Simulated NVML: a GPU's registration with its NVLink fabric (nvmlDeviceGetGpuFabricInfoV).

As a real driver answers (NVML's change log, CUDA 13's nvml.h): the function came with R550, which
knows the v2 structure; v3, with the health summary, came with R580; a version the driver does not
know answers ARGUMENT_VERSION_MISMATCH. The health mask's degraded-bandwidth flag is R550's, the
route-recovery, route-unhealthy and access-timeout-recovery flags came with R570; a flag the driver
does not know reads 0 (NOT_SUPPORTED), the others 1 (TRUE) or 2 (FALSE). The four-bit incorrect
configuration field came with R580's v3 structure ("new Incorrect Configuration statuses"): before it
reads 0 (NOT_SUPPORTED), from it 1 (NONE) or the fault the scenario names, in the fabric's `health`
(`incorrect_configuration: insufficient_nvlinks`) or in an active `fabric_lost` fault's parameters,
which wins. A GPU without a `fabric` in its scenario answers NOT_SUPPORTED, as one with no NVSwitch
to register with.
"""

import ctypes
import uuid

import pynvml

from gpu_monitoring.simulator.abi import nvml, struct_at
from gpu_monitoring.simulator.field_functions import driver_major

# Symbols a driver older than this lacks, as if absent from its libnvidia-ml.
SINCE_DRIVER = {"nvmlDeviceGetGpuFabricInfoV": 550}
V3_SINCE_DRIVER = 580
STATES = {"not_supported": pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
          "not_started": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
          "in_progress": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
          "completed": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED}
SUMMARIES = {"healthy": pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
             "unhealthy": pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
             "limited_capacity": pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY}
# Each flag: where it sits in the mask, and the driver that first reports it.
FLAGS = {
    "degraded_bandwidth": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW, 550),
    "route_recovery": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY, 570),
    "route_unhealthy": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY, 570),
    "access_timeout_recovery": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY, 570),
}
_TRUE, _FALSE = 1, 2
CONFIGURATION_SINCE_DRIVER = V3_SINCE_DRIVER
_CONFIGURATION = "NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_"
# The incorrect configuration values by a scenario's name: nvml.h's name after the prefix, lowercased.
CONFIGURATIONS = {name[len(_CONFIGURATION):].lower(): getattr(pynvml, name)
                  for name in dir(pynvml) if name.startswith(_CONFIGURATION)}
LAYOUTS = {pynvml.nvmlGpuFabricInfo_v2: (pynvml.c_nvmlGpuFabricInfo_v2_t, 550),
           pynvml.nvmlGpuFabricInfo_v3: (pynvml.c_nvmlGpuFabricInfo_v3_t, V3_SINCE_DRIVER)}


@nvml("hp")
def nvmlDeviceGetGpuFabricInfoV(sim, target, out):
    driver = driver_major(sim)
    layout, since = LAYOUTS.get(struct_at(ctypes.c_uint, out).value, (None, 0))
    if layout is None or driver < since:
        return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    fabric = target.device.fabric(sim.now())
    if fabric is None:
        return pynvml.NVML_ERROR_NOT_SUPPORTED
    info = struct_at(layout, out)
    info.clusterUuid[:] = uuid.UUID(fabric.get("cluster_uuid", str(uuid.UUID(int=0)))).bytes
    info.status = getattr(pynvml, fabric.get("status", "NVML_SUCCESS"))
    info.cliqueId = fabric.get("clique_id", 0)
    info.state = _value(STATES, fabric["state"])
    health = fabric.get("health", {})
    info.healthMask = sum((_TRUE if health.get(flag) else _FALSE) << shift
                          for flag, (shift, flag_since) in FLAGS.items() if driver >= flag_since)
    if driver >= CONFIGURATION_SINCE_DRIVER:
        shift = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION
        info.healthMask |= _configuration(target, health, sim.now()) << shift
    if layout is pynvml.c_nvmlGpuFabricInfo_v3_t:
        info.healthSummary = _value(SUMMARIES, fabric.get("summary", "healthy"))
    return pynvml.NVML_SUCCESS


def _configuration(target, health, now):
    """The incorrect configuration the GPU reports: an active `fabric_lost` fault's, else the fabric's."""
    named = health.get("incorrect_configuration", "none")
    for fault in target.device.faults:
        if fault.kind == "fabric_lost" and fault.active(now):
            named = fault.params.get("incorrect_configuration", named)
    return _value(CONFIGURATIONS, named)


def _value(names, value):
    """A scenario's name for an enum value; a number as it is (a driver answering garbage)."""
    return value if isinstance(value, int) else names[value]
