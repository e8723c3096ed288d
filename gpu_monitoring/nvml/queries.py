"""What a run asks of every device, and what a session asks once: each call declared once
(nvml.library says how a call is bound and asked; Device.ask asks it).
"""

import ctypes
import functools
from typing import Any, Optional, Tuple

import pynvml

from gpu_monitoring.nvml import library
from gpu_monitoring.nvml.library import Binding, Query

Output = Any  # a ctypes scalar or structure NVML writes into


def plain(structure: type) -> type:
    """A ctypes structure laid out as pynvml's, without its per-attribute Python hooks."""
    name = structure.__name__[2:] if structure.__name__.startswith("c_") else structure.__name__
    return type(name, (ctypes.Structure,), {"_fields_": structure._fields_})


def answered() -> bool:
    """The value of a query that writes into its arguments: that it succeeded."""
    return True


def _scalar(output: Output) -> int:
    return output.value


def _first(output: Output, _second: Output) -> int:
    return output.value


def _both(first: Output, second: Output) -> Tuple[int, int]:
    return first.value, second.value


def scalar(function: str, *args: int, output: type = ctypes.c_uint) -> Query:
    return Query(function, [output], _scalar, args)


Memory = plain(pynvml.c_nvmlMemory_t)
MemoryV2 = plain(pynvml.c_nvmlMemory_v2_t)
Bar1Memory = plain(pynvml.c_nvmlBAR1Memory_t)
Utilization = plain(pynvml.c_nvmlUtilization_t)


def versioned(version: int) -> Any:
    """What sets a versioned structure's `version` before NVML fills it."""

    def prepare(structure: Any) -> None:
        structure.version = version

    return prepare


def _memory(info: Any) -> Tuple[int, int, int, Optional[int]]:
    return info.total, info.used, info.free, getattr(info, "reserved", None)


CLOCK_TYPES = {
    "sm": pynvml.NVML_CLOCK_SM,
    "memory": pynvml.NVML_CLOCK_MEM,
    "graphics": pynvml.NVML_CLOCK_GRAPHICS,
    "video": pynvml.NVML_CLOCK_VIDEO,
}
CLOCK = {kind: scalar("nvmlDeviceGetClockInfo", clock) for kind, clock in CLOCK_TYPES.items()}
MAX_CLOCKS = ("sm", "memory")  # the clocks whose maximum is read (once per session)
PERFORMANCE_STATE = scalar("nvmlDeviceGetPerformanceState")
# Drivers before R535 know the mask by its older name.
CLOCK_EVENT_REASONS = (
    scalar("nvmlDeviceGetCurrentClocksEventReasons", output=ctypes.c_ulonglong),
    scalar("nvmlDeviceGetCurrentClocksThrottleReasons", output=ctypes.c_ulonglong),
)
UTILIZATION = Query("nvmlDeviceGetUtilizationRates", [Utilization], lambda u: (u.gpu, u.memory))
# (utilization, sampling period): the period is not used.
ENCODER = Query("nvmlDeviceGetEncoderUtilization", [ctypes.c_uint, ctypes.c_uint], _first)
DECODER = Query("nvmlDeviceGetDecoderUtilization", [ctypes.c_uint, ctypes.c_uint], _first)
# The v2 query adds `reserved` and counts it out of `used`; drivers before R510 have only v1.
MEMORY = (
    Query("nvmlDeviceGetMemoryInfo_v2", [MemoryV2], _memory, prepare=versioned(pynvml.nvmlMemory_v2)),
    Query("nvmlDeviceGetMemoryInfo", [Memory], _memory),
)
BAR1 = Query("nvmlDeviceGetBAR1MemoryInfo", [Bar1Memory], lambda b: (b.bar1Total, b.bar1Used))
TEMPERATURE = scalar("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)
FAN_SPEED = scalar("nvmlDeviceGetFanSpeed")
PCIE_GENERATION = scalar("nvmlDeviceGetCurrPcieLinkGeneration")
PCIE_WIDTH = scalar("nvmlDeviceGetCurrPcieLinkWidth")
# KiB/s sampled over 20 ms: TX, then RX.
PCIE_SAMPLED = (scalar("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_TX_BYTES),
                scalar("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_RX_BYTES))
# (current, pending)
MIG_MODE = Query("nvmlDeviceGetMigMode", [ctypes.c_uint, ctypes.c_uint], _both)


def _own_handle(handle: Output) -> Any:
    # The output is written again by the next call: each MIG device keeps a handle of its own.
    return pynvml.c_nvmlDevice_t.from_buffer_copy(handle)


@functools.cache
def mig_device(slot: int) -> Query:
    """The handle of the MIG device in one slot of its GPU; an empty slot answers NOT_FOUND."""
    return Query("nvmlDeviceGetMigDeviceHandleByIndex", [pynvml.c_nvmlDevice_t], _own_handle, (slot,))


# --- read once a session: identity and limits, through pynvml's own bindings ------------------

ARCHITECTURES = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "ada",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "blackwell",
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


UUID = Binding("nvmlDeviceGetUUID", value=_text)
NAME = Binding("nvmlDeviceGetName", value=_text)
ARCHITECTURE = Binding("nvmlDeviceGetArchitecture", value=lambda arch: ARCHITECTURES.get(arch, "unknown"))
PCI_BUS_ID = Binding("nvmlDeviceGetPciInfo", value=lambda info: _text(info.busId))
MINOR_NUMBER = Binding("nvmlDeviceGetMinorNumber")
VBIOS_VERSION = Binding("nvmlDeviceGetVbiosVersion", value=_text)
# nvml.h's nvmlEnableState_t. Read every few minutes, not every run (collectors.inventory).
PERSISTENCE_MODE = Binding("nvmlDeviceGetPersistenceMode", value=lambda mode: mode == pynvml.NVML_FEATURE_ENABLED)
SLOWDOWN_TEMPERATURE = Binding("nvmlDeviceGetTemperatureThreshold", pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
MAX_CLOCK = {kind: Binding("nvmlDeviceGetMaxClockInfo", CLOCK_TYPES[kind]) for kind in MAX_CLOCKS}
PCIE_MAX_GENERATION = Binding("nvmlDeviceGetMaxPcieLinkGeneration")
PCIE_MAX_WIDTH = Binding("nvmlDeviceGetMaxPcieLinkWidth")
MAX_MIG_DEVICES = Binding("nvmlDeviceGetMaxMigDeviceCount")
GPU_INSTANCE_ID = Binding("nvmlDeviceGetGpuInstanceId")


@functools.cache
def gpu_instance_info(gpu_instance_id: int) -> Binding:
    """(profile ID, placement start, placement size in memory slices) of one GPU instance of a GPU."""
    return Binding("nvmlGpuInstanceGetInfo", gpu_instance_id, through=library.gpu_instance_info,
                   value=lambda info: (info.profileId, info.placement.start, info.placement.size))


COMPUTE_INSTANCE_ID = Binding("nvmlDeviceGetComputeInstanceId")
GPM_SUPPORT = Binding("nvmlGpmQueryDeviceSupport", value=lambda support: bool(support.isSupportedDevice))
EVENT_TYPES = Binding("nvmlDeviceGetSupportedEventTypes")


@functools.cache
def register_events(mask: int) -> Binding:
    """Registration of the device for the events in `mask`, into the event set handed to Device.ask."""
    return Binding("nvmlDeviceRegisterEvents", mask, value=lambda _nothing: answered())
