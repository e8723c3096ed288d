"""What the cgroup of each workload that runs a GPU process shows, and each such process's state.

Where each workload's cgroup is: node.cgroup_paths.

What is read each run, per cgroup (all counters since the cgroup was made):

    v2  cpu.stat            usage_usec, nr_periods, nr_throttled   cgroup-v2.rst, "CPU Interface Files"
        io.pressure,        `some avg10=<%>` (the share of the last 10 s in which some of the
        memory.pressure     cgroup's tasks stalled on IO or memory)  Documentation/accounting/psi.rst,
                                                                    "Pressure interface", "Cgroup2 interface"
        cpu.max             "$MAX $PERIOD", MAX "max" for no limit   cgroup-v2.rst, "CPU Interface Files"
    v1  cpu/.../cpu.stat    nr_periods, nr_throttled                Documentation/scheduler/sched-bwc.rst,
                                                                    "Statistics"
        cpuacct/.../cpuacct.usage   CPU time, ns                    Documentation/admin-guide/cgroup-v1/cpuacct.rst
        cpu.cfs_quota_us (-1: no limit), cpu.cfs_period_us         sched-bwc.rst, "Management"
        no pressure files: PSI is a cgroup v2 interface

The quota is read when a cgroup is first seen and again once a minute (it is set when the container
starts and rarely changes); the rest each run. A cgroup's figures are over the interval since the
previous run, on the injected clock:

- `throttled`: Δnr_throttled / Δnr_periods × 100. nr_periods counts the quota's enforcement intervals
  that elapsed (sched-bwc.rst, "Statistics"); a group without a quota has none. Where a baseline exists
  and no interval elapsed, none was throttled either: 0.0, not None, so that a group with no quota reads
  as not throttled. None on a cgroup's first read, and where its cpu.stat has no such lines (cgroup v2
  without the cpu controller enabled).
- `usage_cores`: ΔCPU time / Δclock. None on the first read.
- `quota_cores`: quota / period; None where unbounded.

Cost per run: three small reads per cgroup on v2 (two on v1), the quota's once a minute, and one `stat`
read per process that ran no kernel, each through the file descriptor (node.kernel_files.read_value); on the simulated
dgx-h100 (six workloads, eight processes) about 0.1 ms (`scripts/bench.py --cgroups`). Placing a process's
cgroup is done once, with its owner.
"""

import logging
import math
import os
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Set, Tuple, Union

from gpu_monitoring.node.cgroup_paths import (
    CGROUP_MOUNT,
    CPU_HIERARCHIES,
    CPUACCT_HIERARCHIES,
    cgroup_version,
    hierarchy,
)
from gpu_monitoring.node.kernel_files import read_count, read_value
from gpu_monitoring.node.procfs import stat_fields
from gpu_monitoring.snapshot import CgroupUse, Process

log = logging.getLogger(__name__)

UNINTERRUPTIBLE = "D"  # proc(5), /proc/<pid>/stat field 3
QUOTA_EVERY = 60.0  # seconds between reads of a cgroup's quota
FORGET_AFTER = 600.0  # a cgroup no GPU process was seen in for this long is forgotten
_PSI_SOME = "some avg10="
_V2_COUNTERS = ("usage_usec", "nr_periods", "nr_throttled")
_V1_COUNTERS = ("nr_periods", "nr_throttled")


class _Files(NamedTuple):
    """Where a cgroup's files are (v1: across the cpu and cpuacct hierarchies; None: no such file)."""

    cpu_stat: str
    usage: Optional[str]
    quota: str
    period: Optional[str]
    io: Optional[str]
    memory: Optional[str]


class _Sample(NamedTuple):
    at: float
    usage: int  # CPU time in the version's unit
    periods: Optional[int]
    throttled: Optional[int]


class _V2:
    """A cgroup's files on cgroup v2: all in its own directory."""

    version, per_second = 2, 1e6  # cpu.stat's usage_usec

    def __init__(self, tree: str) -> None:
        self.tree = tree

    def files(self, path: str) -> _Files:
        directory = self.tree + path
        return _Files(f"{directory}/cpu.stat", None, f"{directory}/cpu.max", None,
                      f"{directory}/io.pressure", f"{directory}/memory.pressure")

    @staticmethod
    def counters(files: _Files) -> Optional[Tuple[int, Optional[int], Optional[int]]]:
        usage, periods, throttled = flat_keyed(read_value(files.cpu_stat), _V2_COUNTERS)
        return None if usage is None else (usage, periods, throttled)

    @staticmethod
    def quota(files: _Files) -> Optional[float]:
        return parse_cpu_max(read_value(files.quota))

    @staticmethod
    def pressures(files: _Files) -> Tuple[Optional[float], Optional[float]]:
        return some_avg10(read_value(files.io)), some_avg10(read_value(files.memory))


class _V1:
    """A cgroup's files on cgroup v1: the same path in the cpu hierarchy and in cpuacct's."""

    version, per_second = 1, 1e9  # cpuacct.usage's nanoseconds

    def __init__(self, tree: str) -> None:
        self.cpu = hierarchy(tree, CPU_HIERARCHIES)
        self.cpuacct = hierarchy(tree, CPUACCT_HIERARCHIES)

    def files(self, path: str) -> _Files:
        cpu = self.cpu + path
        return _Files(f"{cpu}/cpu.stat", f"{self.cpuacct}{path}/cpuacct.usage", f"{cpu}/cpu.cfs_quota_us",
                      f"{cpu}/cpu.cfs_period_us", None, None)

    @staticmethod
    def counters(files: _Files) -> Optional[Tuple[int, Optional[int], Optional[int]]]:
        usage = read_count(files.usage)
        if usage is None:
            return None
        periods, throttled = flat_keyed(read_value(files.cpu_stat), _V1_COUNTERS)
        return usage, periods, throttled

    @staticmethod
    def quota(files: _Files) -> Optional[float]:
        return parse_cfs_quota(read_value(files.quota), read_count(files.period))

    @staticmethod
    def pressures(files: _Files) -> Tuple[Optional[float], Optional[float]]:
        return None, None


def flat_keyed(text: Optional[str], keys: Tuple[str, ...]) -> Tuple[Optional[int], ...]:
    """The values of `keys` in a flat-keyed file's `key value` lines (cgroup-v2.rst, "Format"); None for
    a key it lacks or whose value is no number."""
    fields = (text or "").split()
    values = dict(zip(fields[::2], fields[1::2]))
    return tuple(int(value) if value.isdigit() else None for value in (values.get(key, "") for key in keys))


def parse_cpu_max(text: Optional[str]) -> Optional[float]:
    """Cores a v2 `cpu.max` ("$MAX $PERIOD") allows; None for "max" (no limit) or an unreadable file."""
    quota, _, period = (text or "").partition(" ")
    if not (quota.isdigit() and period.isdigit() and int(period)):
        return None
    return int(quota) / int(period)


def parse_cfs_quota(quota: Optional[str], period: Optional[int]) -> Optional[float]:
    """Cores v1's `cpu.cfs_quota_us` over `cpu.cfs_period_us` allow; None for -1 (no limit)."""
    if quota is None or not quota.isdigit() or not period:
        return None
    return int(quota) / period


def some_avg10(text: Optional[str]) -> Optional[float]:
    """The `some avg10` figure (%) of a PSI pressure file; None where it cannot be read."""
    if not text or not text.startswith(_PSI_SOME):
        return None
    end = text.find(" ", len(_PSI_SOME))
    try:
        return float(text[len(_PSI_SOME): end if end > 0 else None])
    except ValueError:
        return None


@dataclass
class _Cgroup:
    """One workload's cgroup between runs: where its files are, its last counters, its quota."""

    files: _Files
    last: Optional[_Sample] = None
    quota: Optional[float] = None
    quota_at: float = -math.inf
    seen: float = 0.0


class WorkloadCgroups:
    """Reads, each run, the cgroups of the workloads running GPU processes and each process's state;
    `cpu_cores` is the host's CPU count."""

    def __init__(self, sysfs_root: str, proc_root: Optional[str], clock: Callable[[], float] = time.time) -> None:
        self.tree = os.path.join(sysfs_root, *CGROUP_MOUNT)
        self.proc_root = proc_root
        self.clock = clock
        self._cgroups: Dict[str, _Cgroup] = {}
        self._unreadable_said = False
        self._sleeping: Set[int] = set()  # pids read in uninterruptible sleep (D) by the last run

    @cached_property
    def cpu_cores(self) -> Optional[int]:
        """The host's CPUs: the `cpuN` lines of `<proc_root>/stat` (proc(5)); read once."""
        return host_cpu_count(self.proc_root)

    @cached_property
    def _layout(self) -> Union[_V1, _V2]:
        return _V2(self.tree) if cgroup_version(self.tree) == 2 else _V1(self.tree)

    def read(self, processes: Iterable[Process]) -> Optional[Dict[str, CgroupUse]]:
        """{cgroup path: what it shows} for each distinct `process.cgroup`, a cgroup that cannot be read
        left out; each process's `state` set as this run reads it. None where the tree cannot be read."""
        paths = self._set_states(processes)
        if not self._tree_readable():
            return None
        now = self.clock()
        found = {}
        for path in paths:
            use = self._read(path, now)
            if use is not None:
                found[path] = use
        self._forget(now)
        return found

    def _set_states(self, processes: Iterable[Process]) -> List[str]:
        """The state of each process that ran no kernel over the interval (or that NVML samples no use of),
        read once per pid: one that ran kernels is neither defunct nor stuck, and its `stat` is left
        unread, so a busy node reads no file of a process it has seen before. A process passes through
        uninterruptible sleep (D) on any disk or driver wait: D counts only where the run before read it
        too, and is None (not told) the first time. The distinct cgroups of all of them, in order."""
        processes = list(processes)
        states: Dict[int, Optional[str]] = {}
        paths: Dict[str, None] = {}
        for process in processes:
            if process.pid not in states:
                ran = process.sm_utilization is not None and process.sm_utilization > 0
                states[process.pid] = None if ran else process_state(self.proc_root, process.pid)
            process.state = states[process.pid]
            if process.cgroup is not None:
                paths[process.cgroup] = None
        sleeping = {pid for pid, state in states.items() if state == UNINTERRUPTIBLE}
        for process in processes:
            if process.state == UNINTERRUPTIBLE and process.pid not in self._sleeping:
                process.state = None
        self._sleeping = sleeping
        return list(paths)

    def _tree_readable(self) -> bool:
        if os.path.isdir(self.tree):
            return True
        if not self._unreadable_said:
            self._unreadable_said = True
            log.info("cannot read the host's cgroup tree at %s (%s): workloads' CPU throttling, CPU use and "
                     "IO and memory pressure are left out; mount the host's /sys there", self.tree,
                     _why_unreadable(self.tree))
        return False

    def _read(self, path: str, now: float) -> Optional[CgroupUse]:
        layout = self._layout
        cgroup = self._cgroups.get(path)
        if cgroup is None:
            cgroup = self._cgroups[path] = _Cgroup(layout.files(path))
        counters = layout.counters(cgroup.files)
        if counters is None:
            cgroup.last = None  # gone (the container ended), or not readable
            return None
        if not 0 <= now - cgroup.quota_at < QUOTA_EVERY:
            cgroup.quota, cgroup.quota_at = layout.quota(cgroup.files), now
        sample = _Sample(now, *counters)
        throttled, usage = rates(cgroup.last, sample, layout.per_second)
        cgroup.last, cgroup.seen = sample, now
        io, memory = layout.pressures(cgroup.files)
        return CgroupUse(layout.version, throttled, usage, cgroup.quota, io, memory)

    def _forget(self, now: float) -> None:
        for path in [path for path, cgroup in self._cgroups.items() if not 0 <= now - cgroup.seen < FORGET_AFTER]:
            del self._cgroups[path]


def rates(before: Optional[_Sample], now: _Sample, per_second: float) -> Tuple[Optional[float], Optional[float]]:
    """(throttled %, cores used) between two samples of a cgroup's counters; (None, None) without an
    earlier sample, or where the counters went back (another cgroup at the same path)."""
    elapsed = now.at - before.at if before is not None else 0.0
    if before is None or elapsed <= 0 or now.usage < before.usage:
        return None, None
    cores = (now.usage - before.usage) / per_second / elapsed
    if None in (now.periods, now.throttled, before.periods, before.throttled):
        return None, cores
    periods = now.periods - before.periods
    if periods < 0:
        return None, cores
    return (100.0 * (now.throttled - before.throttled) / periods if periods else 0.0), cores


def process_state(proc_root: Optional[str], pid: int) -> Optional[str]:
    """The state letter of process `pid` (field 3 of `/proc/<pid>/stat`, proc(5)); None where it exited."""
    if not proc_root:
        return None
    text = read_value(f"{proc_root}/{pid}/stat")
    fields = stat_fields(text)[1] if text else []
    return fields[0] if fields else None


def host_cpu_count(proc_root: Optional[str]) -> Optional[int]:
    """The `cpuN` lines of `<proc_root>/stat`: one for each CPU online (Documentation/filesystems/proc.rst,
    "1.7 Miscellaneous kernel statistics in /proc/stat"); None where it cannot be read."""
    if not proc_root:
        return None
    try:
        with open(os.path.join(proc_root, "stat"), "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return sum(1 for line in lines if line.startswith(b"cpu") and line[3:4].isdigit()) or None


def _why_unreadable(tree: str) -> str:
    try:
        os.listdir(tree)
    except OSError as e:
        return e.strerror or str(e)
    return "not a directory"
