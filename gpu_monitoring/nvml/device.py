"""One GPU (or MIG instance) as NVML sees it: safe calls that learn what it cannot do.

A function NVML refuses for good on this device (NOT_SUPPORTED, a symbol the driver
lacks, no permission, INVALID_ARGUMENT on a MIG handle) is remembered and not called
again until the session restarts. Values come back as plain Python numbers and strings.
"""

import ctypes
import logging
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import pynvml

from . import fallbacks, fields, processes, queries, readings
from .errors import CannotAnswer, GpuLost, NoNewSamples, NvmlUninitialized
from .fields import FieldKey
from .listing import Room

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
_LOST = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_Unknown)
_REFUSED_FOR_GOOD = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_NoPermission,
)
# Bindings that stand in for pynvml's: one call for queries that fill arrays.
_BINDINGS: Dict[str, Callable[..., Any]] = fallbacks.BINDINGS


def _once(read: Callable[["Device"], Any]) -> property:
    """A property asked of NVML once per session, as Device.static keeps it (None if refused):
    identity and limits, read every run from the memo without making a closure each time."""
    name = read.__name__

    def get(device: "Device") -> Any:
        try:
            return device._static[name]
        except KeyError:
            return device.static(name, lambda: read(device))

    return property(get, doc=read.__doc__)


class Device:
    def __init__(self, index: int, handle: Any, parent: Optional["Device"] = None):
        self.index = index
        self.handle = handle
        self.address = handle_address(handle)  # what tells handles apart (events, MIG children)
        self.parent = parent
        self._refused: set = set()
        self._refused_names: Optional[List[str]] = None
        self._denied: set = set()  # refused for want of permission: worth telling, unlike "not supported"
        self.refused_fields: Set[FieldKey] = set()  # not asked of the batch again (nvml.fields)
        self.field_batch: Optional[fields.Batch] = None  # the array the batch hands NVML each run
        self._static: Dict[str, Any] = {}
        self._rooms: Dict[str, Room] = {}  # array size per query that fills one (nvml.listing)
        self._bound: Dict[queries.Query, queries.Bound] = {}  # prepared queries asked so far
        self.fields_timestamp_us = 0  # when NVML took the last batch of field values
        self._children: Dict[int, Device] = {}

    @property
    def is_mig(self) -> bool:
        return self.parent is not None

    def __repr__(self) -> str:
        where = f"MIG {self.index} of GPU {self.parent.index}" if self.parent else f"GPU {self.index}"
        return f"<{where}>"

    # --- the safe call ----------------------------------------------------------------

    def call(self, function: str, *args: Any) -> Any:
        """function(handle, *args); a refusal is remembered under queries.refusal_key, as for Device.read."""
        key = queries.refusal_key(function, args)
        if key in self._refused:
            raise CannotAnswer(f"{function} is not available on {self!r}")
        try:
            return (_BINDINGS.get(function) or getattr(pynvml, function))(self.handle, *args)
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as e:
            raise self._failure(key, e) from e

    def read(self, query: queries.Query) -> Optional[Any]:
        """The answer to a prepared query (nvml.queries), bound to this device when first asked; None
        where the device cannot answer: refused for good (then never asked again, as Device.call
        remembers) or failing this time. A lost GPU or NVML goes up as from Device.call."""
        bound = self._bound.get(query)
        if bound is None:
            bound = self._bind(query)
            if bound is None:
                return None
        status = bound.c_function(*bound.argv)
        if status:
            self._failed(query.key, pynvml.NVMLError(status))
            return None
        return bound.value(*bound.outputs)

    def unbind(self, query: queries.Query) -> None:
        """Forget a query that will not be asked again (its arguments were replaced)."""
        self._bound.pop(query, None)

    def read_first(self, *candidates: queries.Query) -> Optional[Any]:
        """The answer of the first query the device has not refused for good; newer symbols first."""
        for query in candidates:
            answer = self.read(query)
            if answer is not None or query.key not in self._refused:
                return answer
        return None

    def _bind(self, query: queries.Query) -> Optional[queries.Bound]:
        if query.key in self._refused:
            return None
        try:
            bound = self._bound[query] = queries.Bound(query, self.handle)
        except pynvml.NVMLError as e:
            self._failed(query.key, e)
            return None
        return bound

    def _failed(self, key: Tuple, error: Exception) -> None:
        """A failure that costs only this answer passes; one that costs the GPU or NVML goes up."""
        failure = self._failure(key, error)
        if not isinstance(failure, CannotAnswer):
            raise failure from error

    def _failure(self, key: Tuple, error: Exception) -> Exception:
        """What a failed call raises; a refusal for good is remembered first."""
        function = key[0]
        if isinstance(error, _LOST):
            return GpuLost(f"{function}: {error}")
        if isinstance(error, pynvml.NVMLError_Uninitialized):
            return NvmlUninitialized(f"{function}: {error}")
        if isinstance(error, pynvml.NVMLError_NotFound):
            return NoNewSamples(f"{function}: {error}")
        permanent = isinstance(error, (*_REFUSED_FOR_GOOD, pynvml.NVMLLibraryMismatchError))
        if permanent or (self.is_mig and isinstance(error, pynvml.NVMLError_InvalidArgument)):
            self._refuse(key, error)
        return CannotAnswer(f"{function}: {error}")

    def refuses(self, function: str, *args: Any) -> bool:
        """Whether NVML refused function(*args) for good on this device."""
        return queries.refusal_key(function, args) in self._refused

    def _refuse(self, key: Tuple, error: Exception) -> None:
        self._refused.add(key)
        self._refused_names = None
        self._bound = {query: bound for query, bound in self._bound.items() if query.key != key}
        if isinstance(error, pynvml.NVMLError_NoPermission):
            self._denied.add(key[0])
        log.debug("%r: %s answered %s; not asking again until NVML restarts", self, key[0], error)

    def static(self, name: str, read: Callable[[], Any]) -> Any:
        """A value that does not change while the session lasts, read once (None if refused)."""
        if name not in self._static:
            try:
                self._static[name] = read()
            except CannotAnswer:
                self._static[name] = None
        return self._static[name]

    def _optional(self, function: str, *args: Any) -> Optional[Any]:
        """function(*args), or None where the device cannot answer it."""
        try:
            return self.call(function, *args)
        except CannotAnswer:
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

    # --- identity ---------------------------------------------------------------------

    @_once
    def uuid(self) -> str:
        return self.call("nvmlDeviceGetUUID")

    @_once
    def name(self) -> str:
        return self.call("nvmlDeviceGetName")

    @_once
    def architecture(self) -> Optional[str]:
        return ARCHITECTURES.get(self.call("nvmlDeviceGetArchitecture"), "unknown")

    @_once
    def pci_bus_id(self) -> Optional[str]:
        return _text(self.call("nvmlDeviceGetPciInfo").busId)

    @_once
    def minor_number(self) -> Optional[int]:
        return self.call("nvmlDeviceGetMinorNumber")

    # --- activity ---------------------------------------------------------------------

    # Values read every run are None where the GPU cannot give them (Device.read).

    def utilization_rates(self) -> Optional[Tuple[int, int]]:
        return self.read(queries.UTILIZATION)

    def encoder_utilization(self) -> Optional[int]:
        return self.read(queries.ENCODER)

    def decoder_utilization(self) -> Optional[int]:
        return self.read(queries.DECODER)

    # --- memory -----------------------------------------------------------------------

    def memory_info(self) -> Dict[str, Optional[int]]:
        """total/used/free/reserved in bytes (empty if unanswered); reserved is None where only the v1 query exists."""
        answer = self.read_first(*queries.MEMORY)
        if answer is None:
            return {}
        total, used, free, reserved = answer
        return {"total": total, "used": used, "free": free, "reserved": reserved}

    def bar1_memory_info(self) -> Optional[Tuple[int, int]]:
        return self.read(queries.BAR1)

    # --- thermal and power ------------------------------------------------------------

    def temperature(self) -> Optional[int]:
        return self.read(queries.TEMPERATURE)

    @_once
    def slowdown_temperature(self) -> Optional[int]:
        return self.call("nvmlDeviceGetTemperatureThreshold", pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)

    def fan_speed(self) -> Optional[int]:
        return self.read(queries.FAN_SPEED)

    # --- clocks -----------------------------------------------------------------------

    def clock_mhz(self, kind: str) -> Optional[int]:
        return self.read(queries.CLOCK[kind])

    @_once
    def max_clocks_mhz(self) -> Dict[str, Optional[int]]:
        """The SM and memory clocks' maximum, each None where refused."""
        return {kind: self._optional("nvmlDeviceGetMaxClockInfo", queries.CLOCK_TYPES[kind])
                for kind in queries.MAX_CLOCKS}

    def performance_state(self) -> Optional[int]:
        return self.read(queries.PERFORMANCE_STATE)

    def clock_event_reasons(self) -> Optional[int]:
        return self.read_first(*queries.CLOCK_EVENT_REASONS)

    # --- PCIe ---------------------------------------------------------------------------

    def pcie_link(self) -> Tuple[Optional[int], Optional[int]]:
        return self.read(queries.PCIE_GENERATION), self.read(queries.PCIE_WIDTH)

    @_once
    def pcie_link_max(self) -> Tuple[Optional[int], Optional[int]]:
        return self._optional("nvmlDeviceGetMaxPcieLinkGeneration"), self._optional("nvmlDeviceGetMaxPcieLinkWidth")

    @_once
    def nvlink_count(self) -> int:
        return int(readings.read(self, frozenset([("nvlink_link_count", 0)])).get(("nvlink_link_count", 0), 0))

    # --- MIG ----------------------------------------------------------------------------

    def mig_enabled(self) -> Optional[bool]:
        mode = self.read(queries.MIG_MODE)
        return None if mode is None else mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE

    def mig_devices(self) -> List["Device"]:
        """The MIG devices present now; a child keeps its memo while its handle stays the same."""
        # Learnt once it is known: a GPU answers 0 while MIG mode is off, and the mode can change.
        count = self._static.get("max_mig_devices") or self._optional("nvmlDeviceGetMaxMigDeviceCount") or 0
        if count:
            self._static["max_mig_devices"] = count
        found = []
        for slot in range(count):
            handle = self.read(queries.mig_device(slot))
            if handle is None:  # an empty slot, every run on a partly split GPU
                continue
            known = self._children.get(slot)
            if known is None or known.address != handle_address(handle):
                known = self._children[slot] = Device(slot, handle, parent=self)
            found.append(known)
        return found

    @_once
    def gpu_instance_id(self) -> Optional[int]:
        return self.call("nvmlDeviceGetGpuInstanceId")

    @_once
    def compute_instance_id(self) -> Optional[int]:
        return self.call("nvmlDeviceGetComputeInstanceId")

    # --- processes ----------------------------------------------------------------------

    def compute_processes(self) -> List[processes.Listed]:
        """Processes with a compute context (an MPS server among them): pid, used memory (bytes or
        None), GPU and compute instance IDs (None outside MIG)."""
        return self._listed(processes.COMPUTE)

    def mps_clients(self) -> List[processes.Listed]:
        """Processes with an MPS compute context, as compute_processes() gives them."""
        return self._listed(processes.MPS)

    def _listed(self, query: str, *args: Any) -> Any:
        """The answer of the first version of `query` the device serves, newer symbols first.

        Refusals are looked up by symbol alone: the room and the other arguments do not tell calls
        apart, and these queries are asked of every GPU every run.
        """
        room = self._room(query)
        for symbol in processes.SYMBOLS[query]:
            if self.refuses(symbol):
                continue
            try:
                return processes.BINDINGS[symbol](self.handle, room, *args)
            except pynvml.NVMLError as e:
                failure = self._failure((symbol,), e)
                if not self.refuses(symbol):
                    raise failure from e
        raise CannotAnswer(f"none of {', '.join(processes.SYMBOLS[query])} is available on {self!r}")

    def process_utilization(self, since_us: int) -> Optional[Tuple[Dict[int, processes.Usage], int]]:
        """Each process's mean engine use (sm, memory, encoder, decoder) over the samples newer than
        since_us, by pid, and the newest sample's time; None where the device cannot tell.

        No new samples (NOT_FOUND) means no process ran on the GPU since then: an empty answer.
        """
        if self.refuses(processes.UTILIZATION):  # MIG devices and their parents, every run
            return None
        try:
            return self._listed(processes.UTILIZATION, since_us)
        except NoNewSamples:
            return {}, since_us
        except CannotAnswer:
            return None

    def _room(self, query: str) -> Room:
        room = self._rooms.get(query)
        if room is None:  # not setdefault: a Room is made only for a query not asked before
            room = self._rooms[query] = Room()
        return room


def handle_address(handle: Any) -> Optional[int]:
    if handle is None:
        return None
    return ctypes.cast(handle, ctypes.c_void_p).value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
