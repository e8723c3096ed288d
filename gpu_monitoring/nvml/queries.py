"""What a run asks of every device, and what a session asks once: each call declared once, and
beside it the NvmlDevice method that gives its answer as a plain value (DeviceValues). A value
only a function gives is added here, call and method together (nvml.library says how a call is
bound and asked; NvmlDevice.ask asks it).
"""

import ctypes
import functools
from functools import cached_property
from typing import Any, Dict, List, Optional, Tuple

import pynvml

from gpu_monitoring.nvml import fabric, library, processes
from gpu_monitoring.nvml.errors import CannotAnswer
from gpu_monitoring.nvml.library import Binding, Query, answered, plain, scalar, versioned

Output = Any  # a ctypes scalar or structure NVML writes into


def _first(output: Output, _second: Output) -> int:
    return output.value


def _both(first: Output, second: Output) -> Tuple[int, int]:
    return first.value, second.value


Memory = plain(pynvml.c_nvmlMemory_t)
MemoryV2 = plain(pynvml.c_nvmlMemory_v2_t)
Bar1Memory = plain(pynvml.c_nvmlBAR1Memory_t)
Utilization = plain(pynvml.c_nvmlUtilization_t)


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
CLOCK_EVENT_REASON_MASK = (
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


CLOCK_EVENT_REASONS = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
}


class DeviceValues:
    """What a device is asked, each value beside the call that gives it: NvmlDevice's methods, which
    collectors use. `ask` and `ask_first` are NvmlDevice's."""

    parent: Optional["DeviceValues"]

    # Values read once a session are cached properties, None where refused; values read every
    # run are methods, None where the GPU cannot give them this time.

    # --- identity ---------------------------------------------------------------------

    @cached_property
    def uuid(self) -> Optional[str]:
        return self.ask(UUID)

    @cached_property
    def name(self) -> Optional[str]:
        return self.ask(NAME)

    @cached_property
    def architecture(self) -> Optional[str]:
        return self.ask(ARCHITECTURE)

    @cached_property
    def pci_bus_id(self) -> Optional[str]:
        return self.ask(PCI_BUS_ID)

    @cached_property
    def minor_number(self) -> Optional[int]:
        return self.ask(MINOR_NUMBER)

    @cached_property
    def vbios_version(self) -> Optional[str]:
        """As nvidia-smi shows it ("96.00.74.00.0D"). A VBIOS flashed while the driver runs takes effect
        only at a GPU reset or a reboot: one read a session."""
        return self.ask(VBIOS_VERSION)

    def persistence_mode(self) -> Optional[bool]:
        """Whether the driver keeps the GPU initialised while no client holds it; `nvidia-smi -pm` and
        nvidia-persistenced change it while the driver runs."""
        return self.ask(PERSISTENCE_MODE)

    @cached_property
    def event_types(self) -> int:
        """The events NVML can report of this device, as a mask (0 where it cannot tell)."""
        return self.ask(EVENT_TYPES) or 0

    @cached_property
    def gpm_supported(self) -> bool:
        """Whether the GPU (a MIG device's parent) has GPU Performance Monitoring."""
        return self.parent.gpm_supported if self.parent else bool(self.ask(GPM_SUPPORT))

    # --- activity ---------------------------------------------------------------------

    def utilization_rates(self) -> Optional[Tuple[int, int]]:
        return self.ask(UTILIZATION)

    def encoder_utilization(self) -> Optional[int]:
        return self.ask(ENCODER)

    def decoder_utilization(self) -> Optional[int]:
        return self.ask(DECODER)

    # --- memory -----------------------------------------------------------------------

    def memory_info(self) -> Dict[str, Optional[int]]:
        """total/used/free/reserved in bytes (empty if unanswered); reserved is None where only the v1 query exists."""
        answer = self.ask_first(*MEMORY)
        if answer is None:
            return {}
        total, used, free, reserved = answer
        return {"total": total, "used": used, "free": free, "reserved": reserved}

    def bar1_memory_info(self) -> Optional[Tuple[int, int]]:
        return self.ask(BAR1)

    # --- thermal and power ------------------------------------------------------------

    def temperature(self) -> Optional[int]:
        return self.ask(TEMPERATURE)

    @cached_property
    def slowdown_temperature(self) -> Optional[int]:
        return self.ask(SLOWDOWN_TEMPERATURE)

    def fan_speed(self) -> Optional[int]:
        return self.ask(FAN_SPEED)

    # --- clocks -----------------------------------------------------------------------

    def clock_mhz(self, kind: str) -> Optional[int]:
        return self.ask(CLOCK[kind])

    @cached_property
    def max_clocks_mhz(self) -> Dict[str, Optional[int]]:
        """The SM and memory clocks' maximum, each None where refused."""
        return {kind: self.ask(call) for kind, call in MAX_CLOCK.items()}

    def performance_state(self) -> Optional[int]:
        return self.ask(PERFORMANCE_STATE)

    def clock_event_reasons(self) -> Optional[int]:
        return self.ask_first(*CLOCK_EVENT_REASON_MASK)

    # --- PCIe ---------------------------------------------------------------------------

    def pcie_link(self) -> Tuple[Optional[int], Optional[int]]:
        return self.ask(PCIE_GENERATION), self.ask(PCIE_WIDTH)

    @cached_property
    def pcie_link_max(self) -> Tuple[Optional[int], Optional[int]]:
        return self.ask(PCIE_MAX_GENERATION), self.ask(PCIE_MAX_WIDTH)

    def sampled_pcie_throughput(self) -> Optional[Tuple[int, int]]:
        """KiB/s (TX, RX) sampled over 20 ms per direction; None where the device cannot tell. RX is
        not asked where TX is refused."""
        tx = self.ask(PCIE_SAMPLED[0])
        rx = None if tx is None else self.ask(PCIE_SAMPLED[1])
        return None if rx is None else (tx, rx)

    # --- NVLink fabric ---------------------------------------------------------------------

    def fabric_status(self) -> Optional[fabric.FabricStatus]:
        """The GPU's registration with its NVLink fabric; None where the driver cannot tell of it (a
        driver before R550) or cannot answer this time."""
        return self.ask_first(*fabric.QUERIES)

    # --- MIG ----------------------------------------------------------------------------

    def mig_modes(self) -> Optional[Tuple[bool, bool]]:
        """Whether MIG is enabled now, and whether it will be once the GPU is next unbound or reset (the
        pending mode, which `nvidia-smi -mig` sets)."""
        mode = self.ask(MIG_MODE)
        return None if mode is None else (mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE,
                                          mode[1] == pynvml.NVML_DEVICE_MIG_ENABLE)

    @cached_property
    def gpu_instance_id(self) -> Optional[int]:
        return self.ask(GPU_INSTANCE_ID)

    @cached_property
    def compute_instance_id(self) -> Optional[int]:
        return self.ask(COMPUTE_INSTANCE_ID)

    @cached_property
    def gpu_instance_layout(self) -> Optional[Tuple[int, int, int]]:
        """A MIG device's GPU instance: (profile ID, placement start, placement size), asked of its
        GPU once while the MIG device stays (a changed split makes new MIG devices)."""
        if self.parent is None or self.gpu_instance_id is None:
            return None
        return self.parent.ask(gpu_instance_info(self.gpu_instance_id))

    # --- processes ----------------------------------------------------------------------

    def compute_processes(self) -> List[processes.Listed]:
        """Processes with a compute context (an MPS server among them): pid, used memory (bytes or
        None), GPU and compute instance IDs (None outside MIG). Raises CannotAnswer where the
        device cannot list them."""
        return self._listed(processes.COMPUTE)

    def mps_clients(self) -> List[processes.Listed]:
        """Processes with an MPS compute context, as compute_processes() gives them."""
        return self._listed(processes.MPS)

    def _listed(self, query: str) -> List[processes.Listed]:
        listed = self.ask_first(*processes.VERSIONS[query])
        if listed is None:
            raise CannotAnswer(f"no version of {query} answered on {self!r}")
        return listed

    def process_utilization(self, since_us: int) -> Optional[Tuple[Dict[int, processes.Usage], int]]:
        """Each process's mean engine use (sm, memory, encoder, decoder) over the samples newer than
        since_us, by pid, and the newest sample's time; None where the device cannot tell."""
        return self.ask(processes.SAMPLES, since_us)
