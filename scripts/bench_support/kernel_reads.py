"""What the kernel's log costs: a steady run's read with nothing new (this machine's /dev/kmsg where it can
be read, and a file of its records as a simulated node writes), the first read of a full 1 MiB ring
(every record parsed, each message matched, the few recognised made events), and a storm of 5,000
kernel XID lines through the join and the submission, against the same storm told by NVML alone."""

import os
import tempfile
import time
from pathlib import Path
from typing import List, Optional

from datadog_checks.base.stubs import aggregator

from gpu_monitoring.health.xid_join import XidJoin
from gpu_monitoring.node.boot import read_boot_id
from gpu_monitoring.node.kernel_events import KernelEvents
from gpu_monitoring.node.kernel_log import KMSG, KernelLog
from gpu_monitoring.snapshot import Event, Snapshot, load
from gpu_monitoring.submission.events import submit_xids

from .harness import Bench, median_ms, thread_times
from .report import Report, Table

STEADY_LIMIT_MS = 0.3
FIRST_LIMIT_MS = 150.0
RING_BYTES = 1024 * 1024
STORM = 5000
BTIME = 1_795_800_000
BOOT = "6f3c0f52-5a8e-4a07-9f0c-1d2e3f405162"
# A busy node's ring: mostly other tenants' and subsystems' lines, a GPU's now and then.
_NOISE = [
    "EXT4-fs (nvme0n1p2): mounted filesystem 2b7c1f0e-8d3a-4c55-9e61-0f4a2d8b7c13 r/w with ordered data mode.",
    "IPv6: ADDRCONF(NETDEV_CHANGE): cali3f9a2b1c0d4: link becomes ready",
    "eth0: renamed from tmp4f1c2",
    "mlx5_core 0000:1c:00.0 ibp28s0: Link up",
    "audit: type=1400 audit(1795800000.123:412): apparmor=\"STATUS\" operation=\"profile_replace\" profile=\"cri\"",
    "nvidia-uvm: Loaded the UVM driver, major device number 508.",
    "NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: 0 @ g_kern_bus_nvoc.h:1024",
    "pcieport 0000:00:01.0: PME: Signaling with IRQ 26",
]
_XID = "NVRM: Xid (PCI:0000:9b:00): 13, pid=4711, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"


def table(rounds: int, report: Report) -> Table:
    with tempfile.TemporaryDirectory(prefix="gpu-monitoring-kmsg-") as tmp:
        directory = Path(tmp)
        proc = _proc_root(directory)
        ring = _ring(directory / "ring", RING_BYTES)
        records = sum(1 for line in ring.read_bytes().splitlines() if not line.startswith(b" "))
        first_read = lambda: KernelEvents(KernelLog(str(ring), proc, BOOT), proc).read()  # noqa: E731
        first_ms = median_ms(thread_times(first_read, 20))
        steady_file_ms = _steady(str(ring), proc, BOOT, rounds)
        steady_kmsg_ms = _steady(KMSG, "/proc", read_boot_id("/proc"), rounds) if os.access(KMSG, os.R_OK) else None
        storm = _ring(directory / "storm", 0, xids=STORM)
        storm_events = lambda: KernelEvents(KernelLog(str(storm), proc, BOOT), proc).read()  # noqa: E731
        storm_read_ms = median_ms(thread_times(storm_events, 5))
        kernel_events = [load(Event, raw, "event") for raw in storm_events()]
    nvml_events = [Event("GPU-1", "xid", 13, BTIME + 700.0, device_index=0, pci_bus_id="00000000:9B:00.0")
                   for _ in range(STORM)]
    kernel_ms, kernel_sent = _submitted(kernel_events)
    nvml_ms, nvml_sent = _submitted(nvml_events)
    steady = min(figure for figure in (steady_kmsg_ms, steady_file_ms) if figure is not None)
    rows = [
        [f"steady read, nothing new: this machine's {KMSG}", _ms(steady_kmsg_ms),
         report.target("kernel log steady read", steady, f"< {STEADY_LIMIT_MS:g} ms", steady < STEADY_LIMIT_MS)],
        ["steady read, nothing new: a file of its records (a simulated node's)", steady_file_ms, ""],
        [f"first read of a full 1 MiB ring ({records:,} records), recognised and made events", first_ms,
         report.target("kernel log first read of 1 MiB", first_ms, f"< {FIRST_LIMIT_MS:g} ms",
                       first_ms < FIRST_LIMIT_MS)],
        [f"a storm of {STORM:,} kernel XID lines: read and made events", storm_read_ms, ""],
        [f"... joined and submitted ({kernel_sent} event)", kernel_ms, ""],
        [f"the same storm from NVML alone: joined and submitted ({nvml_sent} event)", nvml_ms, ""],
    ]
    return Table(f"The kernel's log: own CPU, median of {rounds} steady reads", ["stage", "ms", "target"], rows,
                 ["a record that matches nothing costs one prefix test and is dropped where it is read; a storm",
                  "is one Datadog event per GPU, code and run whichever source told of it"])


def _steady(path: str, proc: str, boot_id: Optional[str], rounds: int) -> float:
    log = KernelLog(path, proc, boot_id)
    log.read()
    return median_ms(thread_times(log.read, rounds))


def _submitted(events: List[Event]):
    """CPU of joining a run's XIDs and submitting them, and how many Datadog events that made."""
    with Bench("dgx-h100") as bench:
        bench.warm_up(1)
        snapshot = Snapshot(timestamp=BTIME + 710.0, node=bench.check.source.read().node, events=list(events))
        aggregator.reset()
        started = time.thread_time()
        snapshot.events = XidJoin().join(snapshot.events, snapshot.timestamp)
        submit_xids(bench.check, snapshot, {}, [])
        spent = (time.thread_time() - started) * 1000
        sent = len(aggregator.events)
        aggregator.reset()
    return spent, sent


def _ring(path: Path, size: int, xids: int = 0) -> Path:
    """A file of /dev/kmsg records: `size` bytes of a busy node's mixed lines, then `xids` XID lines."""
    lines, written, seq = [], 0, 0
    while written < size:
        text = _XID if seq % 97 == 0 else _NOISE[seq % len(_NOISE)]
        line = f"4,{seq},{600_000_000 + seq * 1000},-;{text}\n"
        lines.append(line)
        written += len(line)
        seq += 1
    lines += [f"4,{seq + n},{700_000_000 + n},-;{_XID}\n" for n in range(xids)]
    path.write_text("".join(lines))
    return path


def _proc_root(directory: Path) -> str:
    (directory / "proc").mkdir()
    (directory / "proc" / "stat").write_text(f"btime {BTIME}\n")
    return str(directory / "proc")


def _ms(value: Optional[float]) -> object:
    return "-" if value is None else value

