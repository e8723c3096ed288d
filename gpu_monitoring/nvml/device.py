"""One GPU (or MIG instance) as NVML sees it: safe calls that learn what it cannot do.

A function NVML refuses for good on this device (NOT_SUPPORTED, a symbol the driver
lacks, no permission, INVALID_ARGUMENT on a MIG handle) is remembered and not called
again until the session restarts. Values come back as plain Python numbers and strings.
"""

import ctypes
import logging
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import pynvml

from .errors import CannotAnswer, GpuLost, NoNewSamples, NvmlUninitialized
from .fields import FIELD_IDS, decode

log = logging.getLogger(__name__)

FieldKey = Tuple[str, int]  # (field name, scope: a link number, 0 for device-wide fields)

CLOCKS = {
    "sm": pynvml.NVML_CLOCK_SM,
    "memory": pynvml.NVML_CLOCK_MEM,
    "graphics": pynvml.NVML_CLOCK_GRAPHICS,
    "video": pynvml.NVML_CLOCK_VIDEO,
}
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
_FIELD_REFUSED = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_NO_PERMISSION,
}
_NO_INSTANCE = 0xFFFFFFFF


class Device:
    def __init__(self, index: int, handle: Any, parent: Optional["Device"] = None):
        self.index = index
        self.handle = handle
        self.parent = parent
        self._refused: set = set()
        self._denied: set = set()  # refused for want of permission: worth telling, unlike "not supported"
        self._refused_fields: set = set()
        self._static: Dict[str, Any] = {}
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
        key = (function, *(a for a in args if isinstance(a, (int, str))))
        if key in self._refused:
            raise CannotAnswer(f"{function} is not available on {self!r}")
        try:
            return (_BINDINGS.get(function) or getattr(pynvml, function))(self.handle, *args)
        except _LOST as e:
            raise GpuLost(f"{function}: {e}") from e
        except pynvml.NVMLError_Uninitialized as e:
            raise NvmlUninitialized(f"{function}: {e}") from e
        except pynvml.NVMLError_NotFound as e:
            raise NoNewSamples(f"{function}: {e}") from e
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as e:
            permanent = isinstance(e, _REFUSED_FOR_GOOD) or isinstance(e, pynvml.NVMLLibraryMismatchError)
            if permanent or (self.is_mig and isinstance(e, pynvml.NVMLError_InvalidArgument)):
                self._refuse(key, e)
            raise CannotAnswer(f"{function}: {e}") from e

    def call_first(self, *calls: Tuple) -> Any:
        """The answer of the first call (function, *args) the device serves; newer symbols first."""
        for function, *args in calls:
            if (function, *args) in self._refused:
                continue
            try:
                return self.call(function, *args)
            except CannotAnswer:
                if (function, *args) not in self._refused:
                    raise
        raise CannotAnswer(f"none of {', '.join(c[0] for c in calls)} is available on {self!r}")

    def _refuse(self, key: Tuple, error: Exception) -> None:
        self._refused.add(key)
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

    def denied_functions(self) -> List[str]:
        """The functions NVML refused this process for want of permission."""
        return sorted(self._denied)

    def refused_functions(self) -> List[str]:
        """What NVML refused for good, as `name` or `name(args)` where arguments told the calls apart."""
        return sorted(f"{key[0]}({', '.join(map(str, key[1:]))})" if key[1:] else key[0] for key in self._refused)

    # --- field values -----------------------------------------------------------------

    def field_values(self, keys: Iterable[FieldKey]) -> Dict[FieldKey, float]:
        """One nvmlDeviceGetFieldValues call for every wanted field; refused fields drop out."""
        wanted = sorted(set(keys) - self._refused_fields)
        if not wanted:
            return {}
        try:
            entries = self.call("nvmlDeviceGetFieldValues", [(FIELD_IDS[name], scope) for name, scope in wanted])
        except CannotAnswer:
            return {}
        values = {}
        for key, entry in zip(wanted, entries):
            if entry.nvmlReturn == pynvml.NVML_SUCCESS:
                values[key] = decode(entry)
                self.fields_timestamp_us = max(self.fields_timestamp_us, entry.timestamp)
            elif entry.nvmlReturn == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"field {key[0]}: GPU is lost")
            elif entry.nvmlReturn in _FIELD_REFUSED:
                self._refused_fields.add(key)
                log.debug("%r: field %s (scope %d) not available; dropped", self, *key)
        return values

    # --- identity ---------------------------------------------------------------------

    @property
    def uuid(self) -> str:
        return self.static("uuid", lambda: self.call("nvmlDeviceGetUUID"))

    @property
    def name(self) -> str:
        return self.static("name", lambda: self.call("nvmlDeviceGetName"))

    @property
    def architecture(self) -> Optional[str]:
        return self.static("architecture", lambda: ARCHITECTURES.get(self.call("nvmlDeviceGetArchitecture"), "unknown"))

    @property
    def pci_bus_id(self) -> Optional[str]:
        return self.static("pci_bus_id", lambda: _text(self.call("nvmlDeviceGetPciInfo").busId))

    @property
    def minor_number(self) -> Optional[int]:
        return self.static("minor_number", lambda: self.call("nvmlDeviceGetMinorNumber"))

    # --- activity ---------------------------------------------------------------------

    def utilization_rates(self) -> Tuple[int, int]:
        rates = self.call("nvmlDeviceGetUtilizationRates")
        return rates.gpu, rates.memory

    def encoder_utilization(self) -> int:
        return self.call("nvmlDeviceGetEncoderUtilization")[0]

    def decoder_utilization(self) -> int:
        return self.call("nvmlDeviceGetDecoderUtilization")[0]

    # --- memory -----------------------------------------------------------------------

    def memory_info(self) -> Dict[str, Optional[int]]:
        """total/used/free/reserved in bytes; reserved is None where only the v1 query exists."""
        info = self.call_first(("nvmlDeviceGetMemoryInfo", pynvml.nvmlMemory_v2), ("nvmlDeviceGetMemoryInfo",))
        reserved = getattr(info, "reserved", None)
        return {"total": info.total, "used": info.used, "free": info.free, "reserved": reserved}

    def bar1_memory_info(self) -> Tuple[int, int]:
        info = self.call("nvmlDeviceGetBAR1MemoryInfo")
        return info.bar1Total, info.bar1Used

    # --- thermal and power ------------------------------------------------------------

    def temperature(self) -> int:
        return self.call("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)

    @property
    def slowdown_temperature(self) -> Optional[int]:
        return self.static(
            "slowdown_temperature",
            lambda: self.call("nvmlDeviceGetTemperatureThreshold", pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        )

    def fan_speed(self) -> int:
        return self.call("nvmlDeviceGetFanSpeed")

    def power_usage_mw(self) -> int:
        return self.call("nvmlDeviceGetPowerUsage")

    def power_limit_mw(self) -> int:
        return self.call("nvmlDeviceGetEnforcedPowerLimit")

    # --- clocks -----------------------------------------------------------------------

    def clock_mhz(self, kind: str) -> int:
        return self.call("nvmlDeviceGetClockInfo", CLOCKS[kind])

    def max_clock_mhz(self, kind: str) -> Optional[int]:
        return self.static(f"max_clock_{kind}", lambda: self.call("nvmlDeviceGetMaxClockInfo", CLOCKS[kind]))

    def performance_state(self) -> int:
        return self.call("nvmlDeviceGetPerformanceState")

    def clock_event_reasons(self) -> int:
        return self.call_first(
            ("nvmlDeviceGetCurrentClocksEventReasons",), ("nvmlDeviceGetCurrentClocksThrottleReasons",)
        )

    # --- PCIe ---------------------------------------------------------------------------

    def pcie_throughput_kib(self) -> Tuple[int, int]:
        return (
            self.call("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_TX_BYTES),
            self.call("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_RX_BYTES),
        )

    def pcie_link(self) -> Tuple[int, int]:
        return self.call("nvmlDeviceGetCurrPcieLinkGeneration"), self.call("nvmlDeviceGetCurrPcieLinkWidth")

    @property
    def pcie_link_max(self) -> Tuple[Optional[int], Optional[int]]:
        return (
            self.static("pcie_max_generation", lambda: self.call("nvmlDeviceGetMaxPcieLinkGeneration")),
            self.static("pcie_max_width", lambda: self.call("nvmlDeviceGetMaxPcieLinkWidth")),
        )

    @property
    def nvlink_count(self) -> int:
        def read() -> int:
            return int(self.field_values([("nvlink_link_count", 0)]).get(("nvlink_link_count", 0), 0))

        return self.static("nvlink_count", read)

    # --- MIG ----------------------------------------------------------------------------

    def mig_enabled(self) -> bool:
        current, _pending = self.call("nvmlDeviceGetMigMode")
        return current == pynvml.NVML_DEVICE_MIG_ENABLE

    def mig_devices(self) -> List["Device"]:
        """The MIG devices present now; a child keeps its memo while its handle stays the same."""
        count = self.static("max_mig_devices", lambda: self.call("nvmlDeviceGetMaxMigDeviceCount")) or 0
        found = []
        for slot in range(count):
            try:
                handle = self.call("nvmlDeviceGetMigDeviceHandleByIndex", slot)
            except CannotAnswer:
                continue
            known = self._children.get(slot)
            if known is None or handle_address(known.handle) != handle_address(handle):
                known = self._children[slot] = Device(slot, handle, parent=self)
            found.append(known)
        return found

    @property
    def gpu_instance_id(self) -> Optional[int]:
        return self.static("gpu_instance_id", lambda: self.call("nvmlDeviceGetGpuInstanceId"))

    @property
    def compute_instance_id(self) -> Optional[int]:
        return self.static("compute_instance_id", lambda: self.call("nvmlDeviceGetComputeInstanceId"))

    # --- processes ----------------------------------------------------------------------

    def processes(self) -> List[Dict[str, Any]]:
        """Compute and MPS-client processes: pid, used_memory (bytes or None), kind, instance ids."""
        found = [_process(p, "compute") for p in self.call_first(*_versions("nvmlDeviceGetComputeRunningProcesses"))]
        try:
            mps = self.call_first(*_versions("nvmlDeviceGetMPSComputeRunningProcesses"))
            found += [_process(p, "mps") for p in mps]
        except CannotAnswer:
            pass
        return found

    def process_utilization(self, since_us: int) -> Tuple[Dict[int, Dict[str, float]], int]:
        """Per-process engine use from samples newer than since_us, and the newest sample's time.

        No new samples (NOT_FOUND) means no process ran on the GPU since then: an empty answer.
        """
        try:
            samples = self.call("nvmlDeviceGetProcessUtilization", since_us)
        except NoNewSamples:
            return {}, since_us
        sums: Dict[int, List[int]] = {}
        newest = since_us
        for sample in samples:
            newest = max(newest, sample.timeStamp)
            total = sums.setdefault(sample.pid, [0, 0, 0, 0, 0])
            for slot, value in enumerate((sample.smUtil, sample.memUtil, sample.encUtil, sample.decUtil, 1)):
                total[slot] += value
        usage = {
            pid: {key: total[slot] / total[4] for slot, key in enumerate(("sm", "memory", "encoder", "decoder"))}
            for pid, total in sums.items()
        }
        return usage, newest


class ProcessInfoV1(ctypes.Structure):
    """`nvmlProcessInfo_v1_t`, what drivers before the `_v2` queries (R450) fill in."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def _versions(query: str) -> Tuple[Tuple[str], ...]:
    return (f"{query}_v3",), (f"{query}_v2",), (query,)


def _v1_processes(symbol: str) -> Callable[[Any], List[Any]]:
    """pynvml's unversioned process queries call the `_v3` symbol, so an old driver's own
    unversioned symbol is called here, with the struct it fills in."""

    def query(handle: Any) -> List[Any]:
        function = pynvml._nvmlGetFunctionPointer(symbol)
        count = ctypes.c_uint(0)
        status = function(handle, ctypes.byref(count), None)
        if status == pynvml.NVML_SUCCESS:
            return []
        if status != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            raise pynvml.NVMLError(status)
        # Room for processes started between the two calls.
        count.value = count.value * 2 + 5
        entries = (ProcessInfoV1 * count.value)()
        pynvml._nvmlCheckReturn(function(handle, ctypes.byref(count), entries))
        return [_available(entry) for entry in entries[: count.value]]

    return query


def _available(entry: ProcessInfoV1) -> Any:
    memory = entry.usedGpuMemory
    # Windows' WDDM mode cannot tell a process's memory: NVML says so with all bits set.
    unknown = memory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    return SimpleNamespace(pid=entry.pid, usedGpuMemory=None if unknown else memory)


# Queries whose pynvml binding cannot reach the symbol an old driver has.
_BINDINGS: Dict[str, Callable[..., Any]] = {
    name: _v1_processes(name)
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses")
}


def _process(info: Any, kind: str) -> Dict[str, Any]:
    gi = getattr(info, "gpuInstanceId", _NO_INSTANCE)
    ci = getattr(info, "computeInstanceId", _NO_INSTANCE)
    return {
        "pid": info.pid,
        "used_memory": info.usedGpuMemory,
        "kind": kind,
        "gpu_instance_id": None if gi == _NO_INSTANCE else gi,
        "compute_instance_id": None if ci == _NO_INSTANCE else ci,
    }


def handle_address(handle: Any) -> Optional[int]:
    if handle is None:
        return None
    return ctypes.cast(handle, ctypes.c_void_p).value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
