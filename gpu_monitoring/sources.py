"""Where a check run gets its Snapshot: NVML in this process, or the node's sidecar."""

import json
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, List, NamedTuple, Optional, Tuple, Union

from gpu_monitoring.deps import MissingPackage, require
from gpu_monitoring.node.boot import read_boot_id
from gpu_monitoring.node.hardware import HardwareReader
from gpu_monitoring.node.kernel_events import KernelEvents
from gpu_monitoring.node.kernel_log import KernelLog
from gpu_monitoring.node.kernel_records import Cursor as KernelCursor
from gpu_monitoring.nvml.errors import LibraryUnavailable
from gpu_monitoring.sidecar import protocol
from gpu_monitoring.sidecar.client import SidecarClient, SidecarUnavailable
from gpu_monitoring.snapshot import Event, Node, Snapshot, load

if TYPE_CHECKING:
    from gpu_monitoring.collectors.node_reader import NodeReader
    from gpu_monitoring.config.derived import Derived
    from gpu_monitoring.kube.allocations import AllocationReader

log = logging.getLogger(__name__)

# Where each source stopped reading, in the persistent cache: the sidecar's journal, and in local mode the
# kernel's log (a sidecar keeps its own place in the log beside its journal).
SIDECAR_CURSOR = "sidecar_event_cursor"
KERNEL_CURSOR = "kernel_log_cursor"


class Cursor(NamedTuple):
    """How far this check has read which journal, as kept in the persistent cache."""

    epoch: Optional[str]
    seq: int

    @classmethod
    def parse(cls, stored: Optional[str]) -> "Cursor":
        """A stored cursor; a bare number (from before journals had epochs) is one in the current
        journal, and anything unreadable is the start of it."""
        if stored and stored.isdigit():
            return cls(None, int(stored))
        try:
            value = json.loads(stored or "")
        except ValueError:
            return cls(None, 0)
        if not isinstance(value, dict) or type(value.get("seq")) is not int or value["seq"] < 0:
            return cls(None, 0)
        epoch = value.get("epoch")
        return cls(epoch if isinstance(epoch, str) else None, value["seq"])

    def dump(self) -> str:
        return json.dumps({"epoch": self.epoch, "seq": self.seq})


class LocalSource:
    """NVML in this process, and the kernel's log. The node reader, and pynvml with it, is opened on the
    first read: a missing package then fails that run like a missing library, and the next run tries again.
    The kernel's log is read whether NVML answers or not (`kernel_events`); its cursor is handed to
    `save_kernel_cursor` once a run submitted what it read."""

    def __init__(self, open_reader: Callable[[], "NodeReader"], kernel: KernelEvents,
                 save_kernel_cursor: Callable[[str], None], hardware: HardwareReader):
        self._open = open_reader
        self._hardware = hardware
        self.reader: Optional[NodeReader] = None
        self.kernel = kernel
        self.save_kernel_cursor = save_kernel_cursor
        self._kernel_saved = kernel.committed

    def read(self) -> Snapshot:
        if self.reader is None:
            try:
                self.reader = self._open()
            except MissingPackage as e:
                raise LibraryUnavailable(str(e)) from None
        snapshot = self.reader.read()
        snapshot.events += self._kernel_events(snapshot.node)
        return snapshot

    def read_without_nvml(self) -> Snapshot:
        """The node around its GPUs (sysfs, the driver's record) and the kernel's log, for a run whose NVML
        cannot be read: a driver that brought up none of the GPUs on the bus is the node's fault to tell,
        and the kernel's log may say why."""
        node = Node()
        self._hardware.read_into(node)
        return Snapshot(timestamp=node.read_at, node=node, events=self._kernel_events(node))

    def _kernel_events(self, node: Node) -> List[Event]:
        """The kernel's events not yet submitted, and into `node` why the log cannot be read, if it cannot."""
        events = [load(Event, raw, "kernel event") for raw in self.kernel.read()]
        node.kernel_log_problem = self.kernel.problem
        return events

    def submitted(self) -> None:
        """This run's events reached the Agent: the node reader and the kernel's log stop handing them out."""
        if self.reader is not None:
            self.reader.acknowledge()
        self.kernel.acknowledge()
        if self.kernel.committed != self._kernel_saved:
            self.save_kernel_cursor(self.kernel.committed.dumps())
            self._kernel_saved = self.kernel.committed

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        self.kernel.close()


class SidecarSource:
    """The sidecar's snapshot plus the journal's events after the stored cursor.

    The cursor moves on only after the run submitted those events (`submitted()`), and it is
    kept in the check's persistent cache, so an Agent restart neither loses nor re-counts. It is
    kept with the journal's epoch: seqs only mean something within one journal, and a journal
    this check has not read before (wiped, replaced) is read from its start.

    Events the check cannot read do not cost the run its snapshot: they stay in the journal for a
    later run, and `events_problem` says why until one reads them.
    """

    def __init__(self, client: SidecarClient, load_cursor: Callable[[], str], save_cursor: Callable[[str], None]):
        self.client = client
        self.load_cursor = load_cursor
        self.save_cursor = save_cursor
        self._next_cursor: Optional[Cursor] = None
        self.events_problem: Optional[str] = None

    def read(self) -> Snapshot:
        # The journal first, then the snapshot: every event handed to this run was journaled before
        # the snapshot's NVML reads, so what an event says changed (XID 154: the recovery action)
        # is read as it is after it, in the same run.
        try:
            events, next_cursor = self._journal_events()
        except SidecarUnavailable as e:
            events, next_cursor = [], None
            self.events_problem = str(e)
        else:
            self.events_problem = None
        try:
            snapshot = self.client.snapshot()
        except SidecarUnavailable as e:
            if e.status == 503:  # the sidecar is up but cannot read NVML
                raise LibraryUnavailable(f"on the sidecar: {e}") from e
            raise
        snapshot.events, self._next_cursor = events, next_cursor
        # A GPU lost before this sidecar could read it is named by its events: a journal record keeps
        # the UUID, index and bus ID NVML gave when the GPU was registered, by this sidecar or one before.
        snapshot.identify_from_events()
        return snapshot

    def _journal_events(self) -> Tuple[List[Event], Optional[Cursor]]:
        epoch = self._epoch()
        events, seq = self._events(self._cursor(epoch))
        if self._epoch() != epoch:
            # The journal was replaced between the pages: which one the events came from is unknown.
            log.warning("the sidecar's journal changed while this check read it; reading it again next run")
            return [], None
        return events, Cursor(epoch, seq)

    def _epoch(self) -> Optional[str]:
        """The journal's identity; None from a sidecar too old to have one."""
        epoch = self.client.get(protocol.HEALTH_PATH).get("epoch")
        return epoch if isinstance(epoch, str) else None

    def _cursor(self, epoch: Optional[str]) -> int:
        stored = Cursor.parse(self.load_cursor())
        if stored.epoch is not None and epoch is not None and stored.epoch != epoch:
            log.info("the sidecar's journal is a new one (epoch %s, not %s): reading it from its start",
                     epoch, stored.epoch)
            return 0
        return stored.seq

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
            self.save_cursor(self._next_cursor.dump())
            self._next_cursor = None

    def close(self) -> None:
        """The sidecar owns NVML; nothing to release here."""


def open_source(derived: "Derived", read_cache: Callable[[str], Optional[str]], write_cache: Callable[[str, str], None],
                sidecar_socket: Optional[str] = None, library: Any = None, library_path: Optional[str] = None,
                allocations: Optional["AllocationReader"] = None,
                clock: Callable[[], float] = time.time) -> Union[LocalSource, SidecarSource]:
    """The source an instance reads: the sidecar at `sidecar_socket`, or NVML in this process (loaded from
    `library`, a simulated node's, else from `library_path`, else by the dynamic linker) with the kernel's log
    from where this check last stopped in this boot, each keeping its place in the persistent cache."""
    if sidecar_socket is not None:
        return SidecarSource(SidecarClient(sidecar_socket), partial(read_cache, SIDECAR_CURSOR),
                             partial(write_cache, SIDECAR_CURSOR))
    proc_root = derived.proc_root
    stored = KernelCursor.loads(read_cache(KERNEL_CURSOR))
    kernel = KernelEvents(KernelLog(derived.kernel_log, proc_root, read_boot_id(proc_root), stored), proc_root)
    hardware = HardwareReader(derived.sysfs_root, proc_root, clock)
    if library is None and library_path:
        library = _library_path(library_path)
    return LocalSource(partial(_open_reader, derived, allocations, library, clock), kernel,
                       partial(write_cache, KERNEL_CURSOR), hardware)


def _library_path(path: str) -> Any:
    from gpu_monitoring.nvml.library import LibraryPath

    return LibraryPath(path, "nvml_library_path")


def _open_reader(derived: "Derived", allocations: Optional["AllocationReader"], library: Any,
                 clock: Callable[[], float]) -> "NodeReader":
    require("pynvml")  # a missing package is named, with the command that adds it
    from gpu_monitoring.collectors.node_reader import NodeReader
    from gpu_monitoring.nvml.session import NvmlSession

    return NodeReader(
        NvmlSession(library),
        disabled=derived.disabled_collectors,
        proc_root=derived.proc_root,
        allocations=allocations,
        # What the profile does not send is not read, where a read gives nothing else: health
        # and attribution judge only metrics of the smallest profile or reads that give them.
        profile=derived.profile,
        sysfs_root=derived.sysfs_root,
        clock=clock,
    )
