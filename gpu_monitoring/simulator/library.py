"""A simulated libnvidia-ml: an object whose attributes are C function pointers.

`SimulatedNvml.library` stands where pynvml keeps its loaded CDLL. pynvml looks each
symbol up on it, calls it through ctypes and maps the return code to its exception
classes, so the bindings run unmodified. A symbol the scenario's driver lacks is simply
not an attribute, which pynvml reports as FUNCTION_NOT_FOUND, as with an old driver.
"""

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Tuple

import pynvml

from gpu_monitoring.simulator import (  # noqa: F401  (register symbols)
    device_functions,
    fabric_functions,
    field_functions,
    gpm_functions,
    process_functions,
    system_functions,
)
from gpu_monitoring.simulator.abi import SYMBOLS, prototype
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.device_model import SimDevice, SimMigInstance
from gpu_monitoring.simulator.fault_events import events_of
from gpu_monitoring.simulator.scenario import Fault, Scenario

log = logging.getLogger(__name__)

HANDLE_STRIDE = 0x10000
NO_INSTANCE = 0xFFFFFFFF

# Queries NVML answers on a MIG device handle; anything else is refused.
MIG_HANDLE_FUNCTIONS = {
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetArchitecture",
    # A GPU instance's handle is its MIG device's here (see nvmlDeviceGetGpuInstanceById).
    "nvmlGpuInstanceGetInfo",
}
# On a MIG handle these answer INVALID_ARGUMENT rather than NOT_SUPPORTED.
MIG_INVALID_ARGUMENT = {"nvmlDeviceGetFieldValues", "nvmlDeviceGetPcieThroughput"}
# A parent GPU in MIG mode no longer reports whole-device engine activity.
MIG_PARENT_REFUSED = {
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetProcessUtilization",
    "nvmlGpmSampleGet",
}


@dataclass
class HandleTarget:
    """The device a handle names: a physical GPU, or one of its MIG instances."""

    device: SimDevice
    mig: Optional[SimMigInstance] = None


@dataclass
class EventSet:
    registrations: Dict[int, int] = field(default_factory=dict)  # device index -> event mask
    queue: Deque[Tuple[int, int, int, int, int]] = field(default_factory=deque)


class SimulatedNvml:
    def __init__(self, scenario: Scenario, clock: Optional[SimClock] = None):
        self.scenario = scenario
        self.clock = clock or SimClock()
        self.devices = [SimDevice(spec, scenario.faults) for spec in scenario.devices]
        self.calls: Counter = Counter()
        # (device index, field ID) -> entries asked of nvmlDeviceGetFieldValues, and those answered NOT_SUPPORTED.
        self.field_requests: Counter = Counter()
        self.field_refusals: Counter = Counter()
        # CPU the calling thread spent inside simulated NVML calls, so benchmarks can exclude it
        # (thread time: the simulated kubelet and gRPC servers run on threads of their own).
        self.cpu_seconds = 0.0
        self.failures: List[str] = []
        self.init_count = 0
        self.event_sets: Dict[int, EventSet] = {}
        self.gpm_samples: Dict[int, Optional[Tuple[HandleTarget, float]]] = {}
        # Faults before the clock's start happened before this node (re)started: no events replay them.
        self._next_fault = sum(1 for fault in scenario.faults if fault.at < self.clock.now())
        self._lock = threading.RLock()
        self._events_ready = threading.Condition(self._lock)
        self._time_listeners: List[Callable[[float], None]] = []
        self._told: Optional[float] = None
        self._ids = 0
        self.library = self._build_library()

    # --- time -----------------------------------------------------------------------

    def now(self) -> float:
        return self.clock.now()

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        with self._lock:
            self._fire_due_faults()
            self._tell_time()

    def on_time(self, listener: Callable[[float], None]) -> None:
        """Have `listener(now)` called, under this library's lock, the first time an NVML call (inside
        the CPU it counts in `cpu_seconds`) or advance() finds scenario time at an instant it has not
        told yet: what the rest of the simulated node shows follows the clock the driver answers by."""
        with self._lock:
            self._time_listeners.append(listener)

    def _tell_time(self) -> None:
        now = self.now()
        if now == self._told:
            return
        self._told = now
        for listener in self._time_listeners:
            listener(now)

    # --- handles and ids ------------------------------------------------------------

    def handle_of(self, device: SimDevice, mig: Optional[SimMigInstance] = None) -> int:
        slot = 0 if mig is None else device.mig.index(mig) + 1
        return HANDLE_STRIDE * (device.index + 1) + slot

    def target(self, handle: Optional[int]) -> Optional[HandleTarget]:
        if not handle:
            return None
        index, slot = divmod(handle, HANDLE_STRIDE)
        if not 0 < index <= len(self.devices):
            return None
        device = self.devices[index - 1]
        if slot == 0:
            return HandleTarget(device)
        if slot > len(device.mig):
            return None
        return HandleTarget(device, device.mig[slot - 1])

    def new_id(self) -> int:
        self._ids += 1
        return 0x7F000000 + self._ids

    def create_event_set(self) -> int:
        set_id = self.new_id()
        self.event_sets[set_id] = EventSet()
        return set_id

    # --- events ---------------------------------------------------------------------

    def _fire_due_faults(self) -> None:
        faults = self.scenario.faults
        while self._next_fault < len(faults) and faults[self._next_fault].at <= self.now():
            self._fire(faults[self._next_fault])
            self._next_fault += 1

    def _fire(self, fault: Fault) -> None:
        if fault.kind == "driver_reload":
            self.init_count = 0
            self.event_sets.clear()
            return
        events = events_of(fault, field_functions.driver_major(self))
        if not events:
            return
        device = self.devices[fault.device]
        gi = fault.params.get("gpu_instance", NO_INSTANCE)
        ci = fault.params.get("compute_instance", NO_INSTANCE if gi == NO_INSTANCE else 0)
        for event_set in self.event_sets.values():
            registered = event_set.registrations.get(device.index, 0)
            event_set.queue.extend((self.handle_of(device), event_type, data, gi, ci)
                                   for event_type, data in events if registered & event_type)
        self._events_ready.notify_all()

    def wait_for_event(self, event_set: EventSet, timeout_s: float) -> bool:
        """Block up to timeout_s for an event; scenario time must be moving for one to come."""
        if not event_set.queue and timeout_s > 0:
            self._events_ready.wait(timeout_s)
            self._fire_due_faults()
        return bool(event_set.queue)

    # --- the C surface --------------------------------------------------------------

    def _build_library(self):
        library = type("SimulatedLibNvidiaMl", (), {})()
        driver = field_functions.driver_major(self)
        missing = set(self.scenario.missing_functions) | {
            name for name, since in fabric_functions.SINCE_DRIVER.items() if driver < since}
        for name, symbol in SYMBOLS.items():
            if name not in missing:
                setattr(library, name, prototype(symbol)(self._entry(name, symbol)))
        return library

    def _entry(self, name: str, symbol):
        def call(*args):
            # Timed from the callback's first line: the lock and the count are the simulator's too.
            started = time.thread_time()
            with self._lock:
                self.calls[name] += 1
                try:
                    self._fire_due_faults()
                    self._tell_time()
                    return self._dispatch(name, symbol, args)
                except Exception as e:  # a C function cannot raise; report and fail the call
                    log.exception("simulated %s failed", name)
                    self.failures.append(f"{name}: {e!r}")
                    return pynvml.NVML_ERROR_UNKNOWN
                finally:
                    self.cpu_seconds += time.thread_time() - started

        return call

    def _dispatch(self, name: str, symbol, args) -> int:
        if name != "nvmlInitWithFlags" and self.init_count == 0:
            return pynvml.NVML_ERROR_UNINITIALIZED
        if not symbol.signature.startswith("h"):
            if name == "nvmlDeviceGetHandleByIndex_v2" and self._off_the_bus(args[0]):
                return pynvml.NVML_ERROR_GPU_IS_LOST
            return symbol.implementation(self, *args)
        target = self.target(args[0])
        if target is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        refusal = self._refusal(name, target)
        if refusal is not None:
            return refusal
        return symbol.implementation(self, target, *args[1:])

    def _off_the_bus(self, index: int) -> bool:
        """A GPU that fell off the bus has no handle to give to an NVML started after: nvidia-smi then
        says "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost". A handle taken
        before the fall stays a handle, whose every call answers GPU_IS_LOST (_refusal)."""
        return index < len(self.devices) and self.devices[index].off_the_bus(self.now())

    def _refusal(self, name: str, target: HandleTarget) -> Optional[int]:
        if target.device.lost(self.now()):
            return pynvml.NVML_ERROR_GPU_IS_LOST
        if target.mig is not None:
            if name in MIG_INVALID_ARGUMENT:
                return pynvml.NVML_ERROR_INVALID_ARGUMENT
            if name not in MIG_HANDLE_FUNCTIONS:
                return pynvml.NVML_ERROR_NOT_SUPPORTED
        elif target.device.mig and name in MIG_PARENT_REFUSED:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        if name in target.device.spec.unsupported:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        return None
