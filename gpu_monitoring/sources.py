"""Where a check run gets its Snapshot: NVML in this process, or the node's sidecar."""

import logging
from typing import TYPE_CHECKING, Callable, List, Optional

from .deps import MissingPackage
from .nvml.errors import LibraryUnavailable
from .sidecar import protocol
from .sidecar.client import SidecarClient, SidecarUnavailable
from .snapshot import Event, Snapshot

if TYPE_CHECKING:
    from .collectors.node import NodeCollector

log = logging.getLogger(__name__)


class LocalSource:
    """NVML in this process. The collector, and pynvml with it, is opened on the first read: a
    missing package then fails that run like a missing library, and the next run tries again."""

    def __init__(self, open_collector: Callable[[], "NodeCollector"]):
        self._open = open_collector
        self.collector: Optional[NodeCollector] = None

    def read(self) -> Snapshot:
        if self.collector is None:
            try:
                self.collector = self._open()
            except MissingPackage as e:
                raise LibraryUnavailable(str(e)) from None
        return self.collector.collect()

    def submitted(self) -> None:
        """Nothing to acknowledge: local events were drained from NVML into this run's snapshot."""

    def close(self) -> None:
        if self.collector is not None:
            self.collector.close()


class SidecarSource:
    """The sidecar's snapshot plus the journal's events after the stored cursor.

    The cursor moves on only after the run submitted those events (`submitted()`), and it is
    kept in the check's persistent cache, so an Agent restart neither loses nor re-counts.
    """

    def __init__(self, client: SidecarClient, load_cursor: Callable[[], str], save_cursor: Callable[[str], None]):
        self.client = client
        self.load_cursor = load_cursor
        self.save_cursor = save_cursor
        self._next_cursor: Optional[int] = None

    def read(self) -> Snapshot:
        try:
            snapshot = self.client.snapshot()
        except SidecarUnavailable as e:
            if e.status == 503:  # the sidecar is up but cannot read NVML
                raise LibraryUnavailable(f"on the sidecar: {e}") from e
            raise
        snapshot.events, self._next_cursor = self._events(self._cursor())
        return snapshot

    def _cursor(self) -> int:
        stored = self.load_cursor()
        return int(stored) if stored and stored.isdigit() else 0

    def _events(self, cursor: int):
        events: List[Event] = []
        for _ in range(protocol.MAX_EVENT_PAGES_PER_RUN):
            page = self.client.events(cursor)
            if page.journal_last_seq < cursor:
                log.warning("the sidecar's journal restarts at %d, behind this check's cursor %d: "
                            "reading it from the start", page.journal_last_seq, cursor)
                cursor = 0
                continue
            if page.lost:
                log.warning("the sidecar's journal rotated away events after %d before this check read them", cursor)
            events += page.events
            if page.last_seq == cursor:
                break
            cursor = page.last_seq
        return events, cursor

    def submitted(self) -> None:
        if self._next_cursor is not None:
            self.save_cursor(str(self._next_cursor))
            self._next_cursor = None

    def close(self) -> None:
        """The sidecar owns NVML; nothing to release here."""
