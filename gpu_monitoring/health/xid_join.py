"""One XID, counted once: NVML's event and the kernel's line for the same fault are one XID.

What tells that NVML's event and the kernel's line are the same XID:
- the GPU: NVML's event comes on a device handle, whose PCI bus ID is read when the GPU is registered
  for events; the driver's line names the GPU's PCI domain, bus and device (`Xid (PCI:0000:9b:00)`).
  Both are compared in NVML's form.
- the code: an XID event's eventData is the XID (nvml.h, nvmlEventData_t); the line's number after the
  bus ID.
- the time: nvmlEventData_t carries none, so an event is stamped when it is drained: by the sidecar
  within a second of the driver's notice, in local mode up to a collection interval later. The driver
  prints its line as it raises the XID, before NVML's waiters hear of it. So an event pairs with a line
  of its GPU and code from up to WINDOW seconds before it (SKEW after, for clocks read apart).
Within a GPU and code, the oldest unpaired of one source pairs with the next of the other: each source
keeps the order of its XIDs. One neither pairs stays counted from the source that saw it: each covers
the other's loss (NVML's events stand in for lines the ring overwrote before they were read; the kernel's
log for XIDs raised while nothing listened to NVML, the sidecar down or restarting).

A pair may be split over two runs: what was counted and not yet paired is remembered for WINDOW
seconds (`dumps`, kept with the check's persistent cache). A pair found within one run is one event,
with what each source knows (the kernel's process and text, NVML's GPU instance).

XID 79, the GPU fallen off the bus, is a state more than a stream: the driver tells of it on an Xid
line, in a "fallen off the bus" message without one (`implied`), and NVML by its event. It is counted
once per GPU per FALL_OFF_WINDOW, whichever told of it first.
"""

import json
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

from gpu_monitoring.node.driver_gpus import nvml_bus_id
from gpu_monitoring.snapshot import Event

WINDOW = 300.0
SKEW = 5.0
FALL_OFF_XID = 79
FALL_OFF_WINDOW = 3600.0
_OTHER = {"nvml": "kernel", "kernel": "nvml"}
# Kept per GPU, code and source: a storm's worth, no more.
MAX_REMEMBERED = 10000

Key = Tuple[str, int, str]  # the GPU, the code, the source


class XidJoin:
    def __init__(self, unpaired: Optional[Dict[Key, List[float]]] = None,
                 fell_off: Optional[Dict[str, float]] = None) -> None:
        self._kept: Tuple[Dict[Key, List[float]], Dict[str, float]] = (dict(unpaired or {}), dict(fell_off or {}))
        self._unpaired, self._fell_off = self._committed()

    def _committed(self) -> Tuple[Dict[Key, Deque[float]], Dict[str, float]]:
        unpaired, fell_off = self._kept
        return {key: deque(times) for key, times in unpaired.items()}, dict(fell_off)

    def commit(self) -> bool:
        """The last join's run was submitted: remember what it counted. Whether that changed what is kept."""
        kept = ({key: list(times) for key, times in self._unpaired.items()}, dict(self._fell_off))
        changed, self._kept = kept != self._kept, kept
        return changed

    def join(self, events: List[Event], now: float) -> List[Event]:
        """The run's events with each XID once: one a partner of this run told of is merged into it; one a
        partner of an earlier run told of is left out (it was counted then). What the run leaves to remember
        is kept only once it is submitted (`commit`): a run that fails hands its events out again."""
        self._unpaired, self._fell_off = self._committed()
        self._forget(now)
        kept: List[Event] = []
        in_run: Dict[Tuple[str, int, float, str], Event] = {}
        for event in sorted(events, key=lambda e: e.timestamp):
            gpu = _gpu(event)
            if event.kind != "xid" or gpu is None:
                kept.append(event)
            elif event.code == FALL_OFF_XID:
                self._fall_off(event, gpu, kept, in_run)
            else:
                self._pair(event, gpu, kept, in_run)
        return kept

    def _pair(self, event: Event, gpu: str, kept: List[Event], in_run: Dict) -> None:
        other = _OTHER[event.source]
        waiting = self._unpaired.get((gpu, event.code, other))
        while waiting and _too_old(waiting[0], event):
            waiting.popleft()  # counted alone: its partner never came
        if waiting and _pairs(waiting[0], event):
            partner = in_run.get((gpu, event.code, waiting.popleft(), other))
            if partner is not None:
                _merge(partner, event)
            return
        kept.append(event)
        in_run[(gpu, event.code, event.timestamp, event.source)] = event
        mine = self._unpaired.setdefault((gpu, event.code, event.source), deque())
        if len(mine) < MAX_REMEMBERED:
            mine.append(event.timestamp)

    def _fall_off(self, event: Event, gpu: str, kept: List[Event], in_run: Dict) -> None:
        told = self._fell_off.get(gpu)
        if told is not None and event.timestamp - told < FALL_OFF_WINDOW:
            partner = in_run.get((gpu, FALL_OFF_XID, told, ""))
            if partner is not None:
                _merge(partner, event)
            return
        kept.append(event)
        in_run[(gpu, FALL_OFF_XID, event.timestamp, "")] = event
        self._fell_off[gpu] = event.timestamp

    def _forget(self, now: float) -> None:
        for key in list(self._unpaired):
            waiting = self._unpaired[key]
            while waiting and waiting[0] < now - WINDOW - SKEW:
                waiting.popleft()
            if not waiting:
                del self._unpaired[key]
        self._fell_off = {gpu: t for gpu, t in self._fell_off.items() if t >= now - FALL_OFF_WINDOW}

    def dumps(self) -> str:
        unpaired, fell_off = self._kept
        return json.dumps({"unpaired": [[gpu, code, source, times] for (gpu, code, source), times in unpaired.items()],
                           "fell_off": fell_off})

    @classmethod
    def loads(cls, text: Optional[str]) -> "XidJoin":
        """What `dumps` wrote; nothing remembered where there is none or it cannot be read."""
        try:
            raw = json.loads(text) if text else {}
            unpaired = {(str(gpu), int(code), str(source)): [float(t) for t in times]
                        for gpu, code, source, times in raw.get("unpaired", [])}
            fell_off = {str(gpu): float(t) for gpu, t in raw.get("fell_off", {}).items()}
            return cls(unpaired, fell_off)
        except (ValueError, TypeError, AttributeError):
            return cls()


def _gpu(event: Event) -> Optional[str]:
    """The GPU as both sources can name it: its PCI bus ID, else its UUID."""
    bus_id = nvml_bus_id(event.pci_bus_id) if event.pci_bus_id else None
    return bus_id or event.device_uuid


def _pairs(earlier: float, event: Event) -> bool:
    """Whether a waiting XID of the other source at `earlier` is this event's partner."""
    if event.source == "nvml":  # the line came before the drained event
        return -SKEW <= event.timestamp - earlier <= WINDOW
    return -WINDOW <= event.timestamp - earlier <= SKEW


def _too_old(earlier: float, event: Event) -> bool:
    return event.timestamp - earlier > WINDOW


_FROM_KERNEL = ("pid", "process_name", "container_id", "pod_uid", "slurm", "detail", "link", "boot_id", "kernel_seq")
_FROM_NVML = ("device_uuid", "device_index", "gpu_instance_id", "compute_instance_id")


def _merge(kept: Event, partner: Event) -> None:
    """What the partner knows that the kept event lacks: the kernel's process and text, NVML's GPU naming."""
    kernel, nvml = (partner, kept) if partner.source == "kernel" else (kept, partner)
    for name in _FROM_KERNEL:
        if getattr(kept, name) is None:
            setattr(kept, name, getattr(kernel, name))
    for name in _FROM_NVML:
        if getattr(kept, name) is None:
            setattr(kept, name, getattr(nvml, name))
    if "nvml" in (kept.source, partner.source):
        kept.source = "nvml"
