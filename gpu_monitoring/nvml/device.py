"""One GPU (or MIG instance) as NVML sees it: every call made of it goes through `NvmlDevice.ask`,
which learns what the device cannot do.

A call NVML refuses for good on this device (NOT_SUPPORTED, a symbol the driver lacks, no
permission, INVALID_ARGUMENT on a MIG handle) is remembered, per function and arguments, and not
made again until the session restarts. Values come back as plain Python numbers and strings.
"""

import ctypes
import logging
from functools import cached_property
from typing import Any, Dict, List, Optional, Set, Tuple

import pynvml

from gpu_monitoring.nvml import fabric, library, processes, queries
from gpu_monitoring.nvml.array_room import Room
from gpu_monitoring.nvml.errors import CannotAnswer

log = logging.getLogger(__name__)

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


class NvmlDevice:
    def __init__(self, index: int, handle: Any, parent: Optional["NvmlDevice"] = None):
        self.index = index
        self.handle = handle
        self.address = handle_address(handle)  # what tells handles apart (events, MIG children)
        self.parent = parent
        self._bound: Dict[library.Call, library.Bound] = {}  # calls asked so far, bound to the handle
        self._rooms: Dict[str, Room] = {}  # array size per query that fills one (nvml.array_room)
        self._refused: Set[Tuple] = set()
        self._refused_names: Optional[List[str]] = None
        self._denied: Set[str] = set()  # refused for want of permission: worth telling, unlike "not supported"
        self._failure: Tuple[Any, str] = (None, "")  # the last call that failed, and why
        self._mig_slots = 0
        self._children: Dict[int, NvmlDevice] = {}

    @property
    def is_mig(self) -> bool:
        return self.parent is not None

    def __repr__(self) -> str:
        where = f"MIG {self.index} of GPU {self.parent.index}" if self.parent else f"GPU {self.index}"
        return f"<{where}>"

    # --- the one way in -----------------------------------------------------------------

    def ask(self, call: library.Call, *args: Any) -> Optional[Any]:
        """The answer to `call` (nvml.queries), bound to this device when first asked; `args` are
        handed over after the bound ones (an event set, a timestamp). None where the device cannot
        answer: refused for good (then never asked again) or failing this time; why_not() says
        which. A lost GPU raises GpuLost, lost NVML NvmlUninitialized."""
        bound = self._bound.get(call)
        if bound is None:
            if call.key in self._refused:
                return None
            bound = self._bound[call] = call.bind(self.handle, self._rooms)
        status = bound.c_function(*bound.argv, *args)
        if status:
            return self._failed(call, status)
        return bound.value(*bound.outputs)

    def _failed(self, call: library.Call, status: int) -> None:
        """A failure that costs only this answer passes, a refusal for good remembered; one that
        costs the GPU or NVML goes up."""
        failure = library.error(call.key[0], status)
        if not isinstance(failure, CannotAnswer):
            raise failure
        self._failure = (call, str(failure))
        if status in library.REFUSED_FOR_GOOD or (self.is_mig and status == library.INVALID_ARGUMENT):
            self._refuse(call.key, status)

    def _refuse(self, key: Tuple, status: int) -> None:
        self._refused.add(key)
        self._refused_names = None
        self._bound = {call: bound for call, bound in self._bound.items() if call.key != key}
        if status == library.NO_PERMISSION:
            self._denied.add(key[0])
        log.debug("%r: %s answered %s; not asking again until NVML restarts", self, key[0], library.describe(status))

    def refuses(self, call: library.Call) -> bool:
        """Whether NVML refused `call` for good on this device."""
        return call.key in self._refused

    def why_not(self, call: library.Call) -> str:
        """Why `call` just gave no answer."""
        if self._failure[0] is call:
            return self._failure[1]
        return f"{call.key[0]} is not available on {self!r}"

    def ask_first(self, *candidates: library.Call) -> Optional[Any]:
        """The answer of the first call the device has not refused for good; newer symbols first."""
        for call in candidates:
            answer = self.ask(call)
            if answer is not None or call.key not in self._refused:
                return answer
        return None

    def denied_functions(self) -> List[str]:
        """The functions NVML refused this process for want of permission."""
        return sorted(self._denied)

    def refused_functions(self) -> List[str]:
        """What NVML refused for good, as `name` or `name(args)` where arguments told the calls apart."""
        if self._refused_names is None:  # every snapshot carries them; they change only with a refusal
            self._refused_names = sorted(
                f"{key[0]}({', '.join(map(str, key[1:]))})" if key[1:] else key[0] for key in self._refused)
        return list(self._refused_names)

    def forget(self, call: library.Call) -> None:
        """Unbind a call that will not be asked again (its arguments were replaced)."""
        self._bound.pop(call, None)

    # Values read once a session are cached properties, None where refused; values read every
    # run are methods, None where the GPU cannot give them this time.

    # --- identity ---------------------------------------------------------------------

    @cached_property
    def uuid(self) -> Optional[str]:
        return self.ask(queries.UUID)

    @cached_property
    def name(self) -> Optional[str]:
        return self.ask(queries.NAME)

    @cached_property
    def architecture(self) -> Optional[str]:
        return self.ask(queries.ARCHITECTURE)

    @cached_property
    def pci_bus_id(self) -> Optional[str]:
        return self.ask(queries.PCI_BUS_ID)

    @cached_property
    def minor_number(self) -> Optional[int]:
        return self.ask(queries.MINOR_NUMBER)

    @cached_property
    def vbios_version(self) -> Optional[str]:
        """As nvidia-smi shows it ("96.00.74.00.0D"). A VBIOS flashed while the driver runs takes effect
        only at a GPU reset or a reboot: one read a session."""
        return self.ask(queries.VBIOS_VERSION)

    def persistence_mode(self) -> Optional[bool]:
        """Whether the driver keeps the GPU initialised while no client holds it; `nvidia-smi -pm` and
        nvidia-persistenced change it while the driver runs."""
        return self.ask(queries.PERSISTENCE_MODE)

    @cached_property
    def event_types(self) -> int:
        """The events NVML can report of this device, as a mask (0 where it cannot tell)."""
        return self.ask(queries.EVENT_TYPES) or 0

    @cached_property
    def gpm_supported(self) -> bool:
        """Whether the GPU (a MIG device's parent) has GPU Performance Monitoring."""
        return self.parent.gpm_supported if self.parent else bool(self.ask(queries.GPM_SUPPORT))

    # --- activity ---------------------------------------------------------------------

    def utilization_rates(self) -> Optional[Tuple[int, int]]:
        return self.ask(queries.UTILIZATION)

    def encoder_utilization(self) -> Optional[int]:
        return self.ask(queries.ENCODER)

    def decoder_utilization(self) -> Optional[int]:
        return self.ask(queries.DECODER)

    # --- memory -----------------------------------------------------------------------

    def memory_info(self) -> Dict[str, Optional[int]]:
        """total/used/free/reserved in bytes (empty if unanswered); reserved is None where only the v1 query exists."""
        answer = self.ask_first(*queries.MEMORY)
        if answer is None:
            return {}
        total, used, free, reserved = answer
        return {"total": total, "used": used, "free": free, "reserved": reserved}

    def bar1_memory_info(self) -> Optional[Tuple[int, int]]:
        return self.ask(queries.BAR1)

    # --- thermal and power ------------------------------------------------------------

    def temperature(self) -> Optional[int]:
        return self.ask(queries.TEMPERATURE)

    @cached_property
    def slowdown_temperature(self) -> Optional[int]:
        return self.ask(queries.SLOWDOWN_TEMPERATURE)

    def fan_speed(self) -> Optional[int]:
        return self.ask(queries.FAN_SPEED)

    # --- clocks -----------------------------------------------------------------------

    def clock_mhz(self, kind: str) -> Optional[int]:
        return self.ask(queries.CLOCK[kind])

    @cached_property
    def max_clocks_mhz(self) -> Dict[str, Optional[int]]:
        """The SM and memory clocks' maximum, each None where refused."""
        return {kind: self.ask(call) for kind, call in queries.MAX_CLOCK.items()}

    def performance_state(self) -> Optional[int]:
        return self.ask(queries.PERFORMANCE_STATE)

    def clock_event_reasons(self) -> Optional[int]:
        return self.ask_first(*queries.CLOCK_EVENT_REASONS)

    # --- PCIe ---------------------------------------------------------------------------

    def pcie_link(self) -> Tuple[Optional[int], Optional[int]]:
        return self.ask(queries.PCIE_GENERATION), self.ask(queries.PCIE_WIDTH)

    @cached_property
    def pcie_link_max(self) -> Tuple[Optional[int], Optional[int]]:
        return self.ask(queries.PCIE_MAX_GENERATION), self.ask(queries.PCIE_MAX_WIDTH)

    def sampled_pcie_throughput(self) -> Optional[Tuple[int, int]]:
        """KiB/s (TX, RX) sampled over 20 ms per direction; None where the device cannot tell. RX is
        not asked where TX is refused."""
        tx = self.ask(queries.PCIE_SAMPLED[0])
        rx = None if tx is None else self.ask(queries.PCIE_SAMPLED[1])
        return None if rx is None else (tx, rx)

    # --- NVLink fabric ---------------------------------------------------------------------

    def fabric_status(self) -> Optional[fabric.FabricStatus]:
        """The GPU's registration with its NVLink fabric; None where the driver cannot tell of it (a
        driver before R550) or cannot answer this time."""
        return self.ask_first(*fabric.QUERIES)

    # --- MIG ----------------------------------------------------------------------------

    def mig_enabled(self) -> Optional[bool]:
        mode = self.ask(queries.MIG_MODE)
        return None if mode is None else mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE

    def mig_devices(self) -> List["NvmlDevice"]:
        """The MIG devices present now; a child keeps its memo while its handle stays the same."""
        # Learnt once it is known: a GPU answers 0 while MIG mode is off, and the mode can change.
        self._mig_slots = self._mig_slots or self.ask(queries.MAX_MIG_DEVICES) or 0
        found = []
        for slot in range(self._mig_slots):
            handle = self.ask(queries.mig_device(slot))
            if handle is None:  # an empty slot, every run on a partly split GPU
                continue
            known = self._children.get(slot)
            if known is None or known.address != handle_address(handle):
                known = self._children[slot] = NvmlDevice(slot, handle, parent=self)
            found.append(known)
        return found

    @cached_property
    def gpu_instance_id(self) -> Optional[int]:
        return self.ask(queries.GPU_INSTANCE_ID)

    @cached_property
    def compute_instance_id(self) -> Optional[int]:
        return self.ask(queries.COMPUTE_INSTANCE_ID)

    @cached_property
    def gpu_instance_layout(self) -> Optional[Tuple[int, int, int]]:
        """A MIG device's GPU instance: (profile ID, placement start, placement size), asked of its
        GPU once while the MIG device stays (a changed split makes new MIG devices)."""
        if self.parent is None or self.gpu_instance_id is None:
            return None
        return self.parent.ask(queries.gpu_instance_info(self.gpu_instance_id))

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


def handle_address(handle: Any) -> Optional[int]:
    if handle is None:
        return None
    return ctypes.cast(handle, ctypes.c_void_p).value
