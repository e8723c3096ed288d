"""One NVML event set, kept for the session: XID, ECC, recovery-action and GPU-unavailable events
drained without blocking.

Each GPU is registered for the types it supports (nvmlDeviceGetSupportedEventTypes): the recovery
action and GPU-unavailable types came with R565 (NVML's change log), so an older driver never lists
them. nvml.h documents eventData only for XIDs (the XID code); for the other types it is kept as the
event's code as the driver gives it, and nothing is judged by it.
"""

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import pynvml

from gpu_monitoring.nvml import library
from gpu_monitoring.nvml.device import NvmlDevice, handle_address
from gpu_monitoring.nvml.errors import CannotAnswer, GpuLost, NvmlError, NvmlUninitialized
from gpu_monitoring.nvml.library import plain
from gpu_monitoring.nvml.queries import register_events

log = logging.getLogger(__name__)

EVENT_KINDS = {
    pynvml.nvmlEventTypeXidCriticalError: "xid",
    pynvml.nvmlEventTypeSingleBitEccError: "ecc_sbe",
    pynvml.nvmlEventTypeDoubleBitEccError: "ecc_dbe",
    pynvml.nvmlEventTypeGpuRecoveryAction: "recovery_action",
    pynvml.nvmlEventTypeGpuUnavailableError: "gpu_unavailable",
}
WANTED = sum(EVENT_KINDS)
_NO_INSTANCE = 0xFFFFFFFF
MAX_EVENTS_PER_DRAIN = 10000
_EventData = plain(pynvml.c_nvmlEventData_t)


@dataclass(frozen=True)
class Registered:
    """A GPU as NVML named it when it was registered for events: what an event names after the GPU is lost."""

    index: Optional[int]
    uuid: Optional[str]
    pci_bus_id: Optional[str]


UNREGISTERED = Registered(None, None, None)  # a handle the set did not register


@dataclass
class RawEvent:
    device: Registered
    kind: str
    code: int
    gpu_instance_id: Optional[int]
    compute_instance_id: Optional[int]
    timestamp: float

    def record(self) -> Dict[str, Any]:
        """The event as plain values: the fields of the Snapshot's Event, and of a journal record."""
        return {
            "device_uuid": self.device.uuid,
            "device_index": self.device.index,
            "pci_bus_id": self.device.pci_bus_id,
            "kind": self.kind,
            "code": self.code,
            "timestamp": self.timestamp,
            "gpu_instance_id": self.gpu_instance_id,
            "compute_instance_id": self.compute_instance_id,
        }


class EventWatcher:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        # nvmlEventData_t carries no time: an event is stamped when it is drained, on the node's clock
        # (a simulated node's own), the clock the kernel's log is read against too.
        self.clock = clock
        self._set: Any = None
        self._registered: Dict[int, Registered] = {}  # by handle address
        self.problem: Optional[str] = None  # why no event can come now, if none can
        self.unsupported = False  # no GPU has any event type wanted: a capability, not a fault

    @property
    def listening(self) -> bool:
        return bool(self._registered)

    def register(self, devices: List[NvmlDevice]) -> None:
        """Register every device not yet registered; the ones that fail are tried next time."""
        self.problem = None
        if self._set is None:
            try:
                self._set = library.call("nvmlEventSetCreate")
            except (CannotAnswer, GpuLost) as e:
                log.debug("%s", e)
                self.problem = str(e)
                return
        for device in devices:
            address = device.address
            if address is None or address in self._registered:
                continue
            try:
                self._register(device)
            except (CannotAnswer, GpuLost) as e:
                log.debug("%r: event registration deferred: %s", device, e)
                self.problem = f"GPU {device.index}: {e}"
        self.unsupported = not self._registered and self.problem is None
        if self._registered:
            self.problem = None
        elif self.unsupported:
            self.problem = "no GPU supports XID, ECC, recovery-action or GPU-unavailable events"

    def _register(self, device: NvmlDevice) -> None:
        mask = device.event_types & WANTED
        if not mask:
            return
        # Read while the GPU answers: a GPU that falls off the bus answers nothing after.
        registered = Registered(device.index, device.uuid, device.pci_bus_id)
        call = register_events(mask)
        if device.ask(call, self._set) is None:
            if not device.refuses(call) or not self._register_each(device, mask):
                raise CannotAnswer(device.why_not(call))
        self._registered[device.address] = registered

    def _register_each(self, device: NvmlDevice, mask: int) -> bool:
        """Each type of `mask` alone, after NVML refused them together: nvmlDeviceRegisterEvents answers
        NOT_SUPPORTED when any one type is not supported (nvml.h), so a type a driver lists yet refuses
        must not cost the others. Whether any was taken; the GPU is then registered, and a type that
        failed is not asked again this session."""
        types = [bit for bit in EVENT_KINDS if mask & bit]
        taken = [bit for bit in types if device.ask(register_events(bit), self._set) is not None]
        if taken:
            log.debug("%r: registered for events %s of %s", device, [EVENT_KINDS[bit] for bit in taken],
                      [EVENT_KINDS[bit] for bit in types])
        return bool(taken)

    def drain(self, timeout_ms: int = 0) -> List[RawEvent]:
        """Events waiting in the set, waiting up to timeout_ms for the first. A set NVML no longer
        knows (freed by a restart elsewhere) raises CannotAnswer: close and register again."""
        events: List[RawEvent] = []
        if self._set is None:
            return events
        while len(events) < MAX_EVENTS_PER_DRAIN:
            data = _EventData()
            try:
                if not library.wait_for_event(self._set, data, timeout_ms):
                    break
            except NvmlUninitialized:
                raise
            except NvmlError as e:
                if events:
                    break  # hand out what came; the next drain meets the error again
                raise CannotAnswer(str(e)) from e
            events.append(self._decode(data))
            timeout_ms = 0
        return events

    def _decode(self, data: Any) -> RawEvent:
        gi, ci = data.gpuInstanceId, data.computeInstanceId
        return RawEvent(
            device=self._registered.get(handle_address(data.device), UNREGISTERED),
            kind=EVENT_KINDS.get(data.eventType, f"type_{data.eventType:#x}"),
            code=int(data.eventData),
            gpu_instance_id=None if gi == _NO_INSTANCE else gi,
            compute_instance_id=None if ci == _NO_INSTANCE else ci,
            timestamp=self.clock(),
        )

    def close(self) -> None:
        if self._set is not None:
            try:
                library.call("nvmlEventSetFree", self._set)
            except NvmlError as e:
                log.debug("nvmlEventSetFree: %s", e)
        self._set = None
        self._registered = {}

