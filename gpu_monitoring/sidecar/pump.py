"""The sidecar's event thread: waits on NVML events for every GPU and journals each one, and with them
what the kernel's log tells (node.kernel_events), read between two waits."""

import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Optional

from gpu_monitoring.node.kernel_events import KernelEvents
from gpu_monitoring.nvml.errors import CannotAnswer, NvmlError, NvmlUninitialized
from gpu_monitoring.nvml.events import EventWatcher
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.sidecar import kernel_cursor
from gpu_monitoring.sidecar.journal import Journal

log = logging.getLogger(__name__)

WAIT_MS = 1000
# Events drained from NVML but not yet journaled (a full disk): NVML hands each out once, so they
# wait here. 10,000 holds an XID storm on every GPU of a node for as long as a disk takes to clear.
BUFFER_EVENTS = 10000


class Backoff:
    """Delays for retrying something that keeps failing: none at first, then doubling to a cap."""

    def __init__(self, first: float = 0.5, most: float = 30.0):
        self.first = first
        self.most = most
        self._next = 0.0

    def next(self) -> float:
        delay = self._next
        self._next = min(max(delay * 2, self.first), self.most)
        return delay

    def reset(self) -> None:
        self._next = 0.0


class EventPump(threading.Thread):
    """Registers GPUs lazily and appends every event to the journal, fsync'd, before waiting
    for the next. Neither NVML nor the disk failing ends the thread: NVML trouble (a driver
    reload, a lost GPU) closes the event set and starts over with back-off, restarting NVML
    when it lost its initialisation (no snapshot request may come to do it); events the
    journal refuses wait in a bounded buffer, retried with back-off."""

    def __init__(self, session: NvmlSession, journal: Journal, session_lock: threading.Lock,
                 restart: Optional[Callable[[], None]] = None, kernel: Optional[KernelEvents] = None,
                 clock: Callable[[], float] = time.time):
        super().__init__(name="gpu-monitoring-events", daemon=True)
        self.session = session
        self.journal = journal
        self.session_lock = session_lock
        self.restart = restart or session.restart
        # The kernel's log is read whether NVML answers or not: a GPU the driver could not bring up is told there.
        self.kernel = kernel
        self.clock = clock
        self._kernel_saved = kernel.committed if kernel is not None else None
        self.stopping = threading.Event()
        self.journaled = 0
        self.dropped = 0  # events the full buffer had to let go
        self.problem: Optional[str] = None  # why events cannot be read now, for /healthz
        self.journal_problem: Optional[str] = None  # why events cannot be journaled now
        self.buffer: Deque[Dict[str, Any]] = deque()
        self._nvml_backoff = Backoff()
        self._journal_backoff = Backoff()
        self._journal_retry_at = 0.0

    def run(self) -> None:
        watcher = EventWatcher(self.clock)
        while not self.stopping.is_set():
            self._flush()
            self._read_kernel()
            try:
                self._pump(watcher)
            except NvmlError as e:
                self._nvml_failed(watcher, e)
            except Exception as e:  # a bug must not end event collection for good
                log.exception("the event thread failed; starting over")
                self._nvml_failed(watcher, e)
        watcher.close()
        self._journal_retry_at = 0.0
        self._flush()
        if self.buffer:
            log.error("stopping with %d events the journal never took: they are lost", len(self.buffer))

    def stop(self) -> None:
        self.stopping.set()

    @property
    def buffered(self) -> int:
        return len(self.buffer)

    # --- NVML ---------------------------------------------------------------------------

    def _pump(self, watcher: EventWatcher) -> None:
        with self.session_lock:
            if not self.session.started:
                self.session.start()
            watcher.register([d for d in self.session.devices if d.handle is not None])
        if not watcher.listening:
            raise CannotAnswer(watcher.problem or "no GPU is registered for events")
        events = watcher.drain(timeout_ms=WAIT_MS)
        self._nvml_recovered()
        for event in events:
            # Each record names its GPU by UUID, index and PCI bus ID as NVML told them at registration:
            # a later sidecar, started after the GPU fell off the bus, cannot ask NVML for them.
            self._hold(event.record())

    def _nvml_failed(self, watcher: EventWatcher, error: Exception) -> None:
        if str(error) != self.problem:
            log.warning("NVML events unavailable (%s); trying again with back-off", error)
        self.problem = str(error)
        watcher.close()
        if isinstance(error, NvmlUninitialized):
            self._restart_nvml()
        self.stopping.wait(self._nvml_backoff.next())

    def _restart_nvml(self) -> None:
        try:
            with self.session_lock:
                self.restart()
        except NvmlError as e:
            log.debug("NVML did not start again yet: %s", e)

    def _nvml_recovered(self) -> None:
        if self.problem is not None:
            log.info("NVML events are read again")
        self.problem = None
        self._nvml_backoff.reset()

    # --- the kernel's log ----------------------------------------------------------------

    def _read_kernel(self) -> None:
        if self.kernel is None:
            return
        for event in self.kernel.read():
            self._hold(event)
        self.kernel.acknowledge()
        # Its cursor moves on only once the journal holds every event read: a restart reads the rest again.
        if not self.buffer and self.kernel.committed != self._kernel_saved:
            try:
                kernel_cursor.save(self.journal, self.kernel.committed)
            except OSError as e:
                log.debug("cannot save the kernel log's cursor (the journal keeps it): %s", e)
                return
            self._kernel_saved = self.kernel.committed

    # --- the journal --------------------------------------------------------------------

    def _hold(self, record: Dict[str, Any]) -> None:
        if len(self.buffer) >= BUFFER_EVENTS:
            self.dropped += 1
            log.error("event buffer full (%d events) while the journal fails: dropping an event (%d so far)",
                      BUFFER_EVENTS, self.dropped)
            return
        self.buffer.append(record)
        self._flush()

    def _flush(self) -> None:
        if not self.buffer or time.monotonic() < self._journal_retry_at:
            return
        try:
            while self.buffer:
                self.journal.append(self.buffer[0])
                self.buffer.popleft()
                self.journaled += 1
        except OSError as e:
            self._journal_failed(e)
            return
        if self.journal_problem is not None:
            log.info("the journal takes events again")
        self.journal_problem = None
        self._journal_backoff.reset()

    def _journal_failed(self, error: OSError) -> None:
        if str(error) != self.journal_problem:
            log.error("cannot journal events (%s); holding %d in memory and trying again with back-off",
                      error, len(self.buffer))
        self.journal_problem = str(error)
        self._journal_retry_at = time.monotonic() + self._journal_backoff.next()
