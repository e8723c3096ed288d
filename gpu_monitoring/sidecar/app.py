"""The sidecar: owns NVML on a GPU node and serves snapshots and the event journal on a unix socket."""

import logging
import os
import signal
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from gpu_monitoring import __version__
from gpu_monitoring.collectors.node_reader import NodeReader
from gpu_monitoring.kube import DEFAULT_TTL
from gpu_monitoring.kube.allocations import AllocationReader
from gpu_monitoring.node.boot import read_boot_id
from gpu_monitoring.node.kernel_events import KernelEvents
from gpu_monitoring.node.kernel_log import NONE, KernelLog
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.errors import NvmlError
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.sidecar import kernel_cursor, protocol
from gpu_monitoring.sidecar.journal import Journal, JournalLockedError
from gpu_monitoring.sidecar.pump import BUFFER_EVENTS, EventPump
from gpu_monitoring.sidecar.readiness import NvmlReadiness
from gpu_monitoring.sidecar.server import ApiError, Response, UnixHttpServer, integer

# The exporter's reader (prometheus_client's parser, an HTTP client) is loaded only by a sidecar told
# to read one: most read none.
if TYPE_CHECKING:
    from gpu_monitoring.dcgm.reader import DcgmReader

log = logging.getLogger(__name__)


class Sidecar:
    def __init__(
        self,
        socket_path: str = protocol.DEFAULT_SOCKET,
        journal_dir: str = protocol.DEFAULT_JOURNAL,
        library: Any = None,
        proc_root: Optional[str] = "/proc",
        pod_resources_socket: Optional[str] = None,
        journal_wait: float = 30.0,
        pod_cache_ttl: float = DEFAULT_TTL,
        dcgm_exporter_url: Optional[str] = None,
        sysfs_root: Optional[str] = "/sys",
        clock: Callable[[], float] = time.time,
        kernel_log: str = "auto",
    ):
        self.socket_path = socket_path
        self.session = NvmlSession(library)
        self.session_lock = threading.Lock()
        allocations = AllocationReader(pod_resources_socket, ttl=pod_cache_ttl) if pod_resources_socket else None
        self.reader = NodeReader(self.session, proc_root=proc_root, allocations=allocations, watch_events=False,
                                 sysfs_root=sysfs_root, clock=clock)
        self.journal = _open_journal(journal_dir, journal_wait)
        self.kernel = _kernel_events(kernel_log, proc_root, self.journal)
        self.pump = EventPump(self.session, self.journal, self.session_lock, restart=self.reader.restart,
                              kernel=self.kernel, clock=clock)
        self.readiness = NvmlReadiness(self.session, self.session_lock)
        # The node's dcgm-exporter, read with every snapshot; its own lock: a slow exporter must not
        # hold NVML (and the event pump) for its deadline.
        self.dcgm_exporter_url = dcgm_exporter_url
        self.dcgm = _dcgm_reader(dcgm_exporter_url) if dcgm_exporter_url else None
        self.dcgm_lock = threading.Lock()
        self.snapshots_served = 0
        self.server = UnixHttpServer(socket_path, {
            protocol.SNAPSHOT_PATH: self.snapshot,
            protocol.EVENTS_PATH: self.events,
            protocol.HEALTH_PATH: self.health,
        })

    # --- the API ------------------------------------------------------------------------

    def snapshot(self, params: Dict[str, str]) -> Response:
        _no_params(params, ())
        with self.session_lock:
            try:
                taken = self.reader.read()
            except NvmlError as e:
                self.readiness.failed(e)
                raise ApiError(503, f"NVML cannot be read: {e}") from e
            self.readiness.learn(taken.devices)
            self.snapshots_served += 1
        # The event thread reads the kernel's log; whether it can is the node's to tell.
        taken.node.kernel_log_problem = self.kernel.problem if self.kernel is not None else None
        if self.dcgm is not None:
            from gpu_monitoring.dcgm.outcome import carried

            with self.dcgm_lock:
                # Never None: a URL is configured. Finding the exporter (`auto`) takes the kubelet's
                # pod list, which only the check reads.
                taken.dcgm_read = carried(self.dcgm.enrich(taken, None))
        return 200, {"snapshot": taken.to_dict()}

    def events(self, params: Dict[str, str]) -> Response:
        _no_params(params, ("after", "limit"))
        after = integer(params, "after", 0, 0, 2**63 - 1)
        limit = integer(params, "limit", protocol.DEFAULT_EVENTS_LIMIT, 1, protocol.MAX_EVENTS_LIMIT)
        page = self.journal.read(after, limit)
        return 200, {"events": page.records, "last_seq": page.last_seq, "first_seq": page.first_seq, "lost": page.lost,
                     "epoch": page.epoch}

    def health(self, params: Dict[str, str]) -> Response:
        _no_params(params, ())
        journal = self.pump.journal_problem
        nvml = self.readiness.problem()
        # NVML that cannot be read at all fails the probe: the sidecar has nothing to serve. So does a
        # journal that cannot be written: events pile up in memory until it is fixed. NVML refusing
        # events does not: snapshots are still served, and restarting would not bring events back.
        return 200, {
            "status": "ok" if journal is None and nvml is None else "failing",
            "version": __version__,
            "nvml": "ok" if nvml is None else nvml,
            "events": "ok" if self.pump.problem is None else self.pump.problem,
            # Not part of readiness: a log that cannot be read costs the node its record, not its snapshots.
            "kernel_log": "off" if self.kernel is None else self.kernel.problem or "ok",
            "journal": "ok" if journal is None else f"cannot write: {journal}",
            "events_buffered": self.pump.buffered,
            "events_buffer_size": BUFFER_EVENTS,
            "events_dropped": self.pump.dropped,
            "last_seq": self.journal.last_seq,
            "epoch": self.journal.epoch,
            "snapshots_served": self.snapshots_served,
        }

    # --- life cycle ---------------------------------------------------------------------

    def serve(self) -> None:
        """Serve until SIGTERM or SIGINT, then stop cleanly."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: threading.Thread(target=self.server.shutdown, daemon=True).start())
        level, line = self._startup_line()
        log.log(level, "%s", line)
        self._first_read()
        self.pump.start()
        try:
            self.server.serve_forever(poll_interval=0.5)
        finally:
            self.close()

    def _first_read(self) -> None:
        """Read the node once before serving: a GPU that falls off the bus before the Agent's first
        snapshot keeps what NVML told of it (its architecture, which the driver's record lacks, too)."""
        with self.session_lock:
            if not self.session.started:
                return
            try:
                self.readiness.learn(self.reader.read().devices)
            except NvmlError as e:
                log.debug("the node's first read failed; the first snapshot reads it again: %s", e)

    def _startup_line(self) -> Tuple[int, str]:
        """What an operator checks first, and the level to log it at: WARNING while NVML or pod-resources fail."""
        nvml = self.readiness.problem()  # starts NVML, as the first readiness probe would
        pod_resources, pod_resources_failing = self._pod_resources_state()
        parts = [
            f"gpu-monitoring sidecar {__version__} serving on {self.socket_path}",
            self._gpus() if nvml is None else f"NVML cannot be read: {nvml}",
            f"journal {self.journal.directory}, last seq {self.journal.last_seq}",
            _kernel_state(self.kernel),
            pod_resources,
            f"dcgm-exporter {self.dcgm_exporter_url} read with every snapshot" if self.dcgm else
            "dcgm-exporter not read (no --dcgm-exporter-url; the check reads it)",
        ]
        return (logging.WARNING if nvml or pod_resources_failing else logging.INFO), "; ".join(parts)

    def _gpus(self) -> str:
        with self.session_lock:
            models = Counter(_model(device) for device in self.session.devices)
            driver = self.session.driver_version or "unknown"
        count = sum(models.values())
        listed = ", ".join(f"{n}x {name}" for name, n in sorted(models.items()))
        return f"{count} GPU{'s' if count != 1 else ''} ({listed}), driver {driver}"

    def _pod_resources_state(self) -> Tuple[str, bool]:
        reader = self.reader.allocations
        if reader is None:
            return ("pod-resources not read (no --pod-resources-socket; the default is read in a pod or where "
                    "the kubelet serves it)"), False
        answer = reader.read()
        if answer.source == "error":
            return f"pod-resources cannot be read: {answer.error}", True
        return f"pod-resources {reader.socket_path} reads: {len(answer.items)} devices allocated", False

    def close(self) -> None:
        self.pump.stop()
        if self.pump.is_alive():
            self.pump.join(timeout=5)
        self.server.server_close()
        with self.session_lock:
            self.reader.close()
        if self.dcgm is not None:
            with self.dcgm_lock:
                self.dcgm.close()
        if self.kernel is not None:
            self.kernel.close()
        self.journal.close()
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        log.info("gpu-monitoring sidecar stopped")


def _kernel_events(setting: str, proc_root: Optional[str], journal: Journal) -> Optional[KernelEvents]:
    """The kernel's log, from where the journal says this sidecar (or one before it) stopped in this boot."""
    if setting == NONE:
        return None
    log_ = KernelLog(setting, proc_root, read_boot_id(proc_root), kernel_cursor.load(journal), option="--kernel-log")
    return KernelEvents(log_, proc_root)


def _open_journal(directory: str, wait_seconds: float = 30.0) -> Journal:
    """The journal has one writer: a sidecar still shutting down (a restart, a rolling update)
    holds it for a moment, so wait for it rather than fail."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            return Journal(directory)
        except JournalLockedError:
            if time.monotonic() >= deadline:
                raise
            log.info("journal %s is still held by another sidecar; waiting", directory)
            time.sleep(1)


def _dcgm_reader(url: str) -> "DcgmReader":
    from gpu_monitoring.dcgm.reader import DcgmReader

    return DcgmReader(url)


def _kernel_state(kernel: Optional[KernelEvents]) -> str:
    if kernel is None:
        return "kernel log not read (--kernel-log none)"
    cursor = kernel.committed
    where = f"on from record {cursor.seq} of this boot" if cursor.seq >= 0 else "from this boot's first record kept"
    return f"kernel log {kernel.log.setting} read {where}"


def _model(device: NvmlDevice) -> str:
    try:
        return device.name if device.handle is not None else "lost"
    except NvmlError:
        return "lost"


def _no_params(params: Dict[str, str], allowed) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ApiError(400, f"unknown parameter {unknown[0]!r}" + (f"; known: {', '.join(allowed)}" if allowed else ""))
