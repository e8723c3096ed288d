"""The sidecar's event thread: waits on NVML events for every GPU and journals each one."""

import logging
import threading
from typing import Any, Dict

from ..nvml.errors import NvmlError
from ..nvml.events import EventWatcher, RawEvent
from ..nvml.session import NvmlSession
from .journal import Journal

log = logging.getLogger(__name__)

WAIT_MS = 1000
RETRY_SECONDS = 5.0


class EventPump(threading.Thread):
    """Registers GPUs lazily (one that refused is tried again every wait) and appends every
    event to the journal, fsync'd, before waiting for the next. NVML trouble (a driver
    reload, a lost GPU) closes the event set and starts over after a pause."""

    def __init__(self, session: NvmlSession, journal: Journal, session_lock: threading.Lock):
        super().__init__(name="gpu-monitoring-events", daemon=True)
        self.session = session
        self.journal = journal
        self.session_lock = session_lock
        self.stopping = threading.Event()
        self.journaled = 0
        self.problem = None  # why events cannot be read now, for /healthz

    def run(self) -> None:
        watcher = EventWatcher()
        while not self.stopping.is_set():
            try:
                self._pump(watcher)
                self.problem = None
            except NvmlError as e:
                if str(e) != self.problem:
                    log.warning("NVML events unavailable (%s); trying again every %.0f s", e, RETRY_SECONDS)
                self.problem = str(e)
                watcher.close()
                watcher = EventWatcher()
                self.stopping.wait(RETRY_SECONDS)
        watcher.close()

    def _pump(self, watcher: EventWatcher) -> None:
        with self.session_lock:
            if not self.session.started:
                self.session.start()
            devices = [d for d in self.session.devices if d.handle is not None]
            watcher.register(devices)
            uuids = {d.index: d.uuid for d in devices}
        for event in watcher.drain(timeout_ms=WAIT_MS):
            self.journal.append(_record(event, uuids))
            self.journaled += 1

    def stop(self) -> None:
        self.stopping.set()


def _record(event: RawEvent, uuids: Dict[int, Any]) -> Dict[str, Any]:
    return {
        "device_uuid": uuids.get(event.device_index),
        "kind": event.kind,
        "code": event.code,
        "timestamp": event.timestamp,
        "gpu_instance_id": event.gpu_instance_id,
        "compute_instance_id": event.compute_instance_id,
    }
