"""A simulated node's cgroup tree: each workload's cgroup under the sysfs root's `fs/cgroup`, where the
host's /sys/fs/cgroup is, with the files and text the kernel shows.

Every container of the scenario's pods has a cgroup at the path `proc_root.container_cgroup_path` gives
(the one its processes' `/proc/<pid>/cgroup` names), every Slurm job one at `proc_root.slurm_job_cgroup_path`,
on the cgroup version the container (`cgroup_version`) or the scenario's `slurm` block sets:

    cgroup.controllers                      v2 only (kernel Documentation/admin-guide/cgroup-v2.rst,
                                            "Enabling and Disabling"); written where any workload, or none, is on v2
    <path>/cpu.stat                         v2: usage_usec, user_usec, system_usec, nr_periods, nr_throttled,
                                            throttled_usec, nr_bursts, burst_usec (cgroup-v2.rst, "CPU Interface
                                            Files"; the order of kernel/cgroup/rstat.c and kernel/sched/core.c's
                                            cpu_extra_stat_show)
    <path>/cpu.max                          "$MAX $PERIOD": "max 100000" with no quota
    <path>/io.pressure, memory.pressure     "some avg10=%.2f avg60=%.2f avg300=%.2f total=%d" and a `full` line
                                            (Documentation/accounting/psi.rst, "Pressure interface")
    cpu,cpuacct/<path>/cpu.stat             v1: nr_periods, nr_throttled, throttled_time (ns), nr_bursts,
                                            burst_time (Documentation/scheduler/sched-bwc.rst, "Statistics";
                                            kernel/sched/core.c, cpu_cfs_stat_show)
    cpu,cpuacct/<path>/cpuacct.usage        CPU time in ns (Documentation/admin-guide/cgroup-v1/cpuacct.rst)
    cpu,cpuacct/<path>/cpu.cfs_quota_us     -1 with no quota; cpu.cfs_period_us 100000 (sched-bwc.rst, "Management")
    cpu -> cpu,cpuacct, cpuacct -> cpu,cpuacct   the links systemd makes beside a co-mounted v1 hierarchy

A pod's container or a Slurm job may carry a `cgroup` mapping; each key has a default:

    cgroup:
      cpu_quota: 4            # cores its quota allows; default none (unbounded)
      throttled_percent: 62   # the share of the quota's enforcement periods it is throttled in; default 0
      cpu_cores_used: 3.96    # cores its processes keep busy; default 0.25
      io_some_avg10: 38.5     # io.pressure's `some` averages, %; default 0.00
      memory_some_avg10: 0    # memory.pressure's likewise

Counters grow with scenario time from the cgroup's making, RUNNING_BEFORE seconds before scenario time 0.
Only a cgroup with a quota counts periods: the kernel runs its period timer for a group with a quota
alone (sched-bwc.rst). A throttled period is taken to hold the group back a fifth of it (throttled_usec);
the `full` pressure is half the `some`. `CgroupTree.build()` writes the tree at a scenario time and
`update()` rewrites, each by a rename beside the tree, only the files whose text moved: each cgroup's CPU
counters, and the pressure files of a cgroup under pressure.
"""

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from gpu_monitoring.simulator.proc_root import container_cgroup_path, slurm_job_cgroup_path

# The processes of the proc root start some twenty minutes before scenario time 0 (its default start time,
# in clock ticks after a boot kernel_log.BOOT_UPTIME before), and their cgroups with them.
RUNNING_BEFORE = 1200.0
PERIOD_US = 100_000  # the default period (sched-bwc.rst; cgroup-v2.rst, cpu.max)
# The controllers a v2 root offers on a node with every usual one built in.
CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc\n"
V1_CPU = "cpu,cpuacct"
V1_LINKS = ("cpu", "cpuacct")
USER_SHARE = 0.9  # of the CPU time, the share spent in user space


@dataclass(frozen=True)
class Workload:
    """A workload's cgroup: where it is, on which cgroup version, and what its scenario says of it."""

    path: str
    version: int = 2
    cpu_quota: Optional[float] = None
    throttled_percent: float = 0.0
    cpu_cores_used: float = 0.25
    io_some_avg10: float = 0.0
    memory_some_avg10: float = 0.0


_SETTINGS = tuple(f.name for f in fields(Workload))[2:]


def workload(path: str, version: int, settings: Optional[Mapping[str, Any]]) -> Workload:
    """The workload at `path` with a scenario's `cgroup` mapping; a key it does not know is an error."""
    settings = dict(settings or {})
    unknown = set(settings) - set(_SETTINGS)
    if unknown:
        raise ValueError(f"cgroup: unknown keys {', '.join(sorted(unknown))} (known: {', '.join(_SETTINGS)})")
    if version not in (1, 2):
        raise ValueError(f"cgroup_version must be 1 or 2, not {version!r}")
    quota = settings.pop("cpu_quota", None)
    return Workload(path, version, None if quota is None else float(quota),
                    **{key: float(value) for key, value in settings.items()})


def scenario_workloads(pods: Iterable[Mapping[str, Any]], slurm: Mapping[str, Any]) -> List[Workload]:
    """Every pod container's cgroup (pods as simulator.node reads them: with `uid` and each container's
    `container_id`) and every Slurm job's."""
    found = [
        workload(container_cgroup_path(c["container_id"], pod["uid"], c.get("qos", "burstable"),
                                       c.get("runtime", "containerd"), c.get("cgroup_driver", "systemd")),
                 int(c.get("cgroup_version", 2)), c.get("cgroup"))
        for pod in pods
        for c in pod["containers"]
    ]
    version = int(slurm.get("cgroup_version", 2))
    found += [
        workload(slurm_job_cgroup_path(job["id"], int(job.get("uid", 1000)), version, slurm.get("nodename")),
                 version, job.get("cgroup"))
        for job in slurm.get("jobs", [])
    ]
    return found


def cgroup_files(spec: Workload, now: float) -> Iterator[Tuple[str, str]]:
    """(file under the cgroup's directory, text) of each of its files that moves with time, at `now`."""
    elapsed = RUNNING_BEFORE + max(now, 0.0)
    usage_us = round(spec.cpu_cores_used * elapsed * 1e6)
    periods = int(elapsed * 1e6 // PERIOD_US) if spec.cpu_quota is not None else 0
    throttled = int(periods * spec.throttled_percent / 100)
    throttled_us = throttled * PERIOD_US // 5
    if spec.version == 1:
        yield "cpu.stat", (f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time {throttled_us * 1000}\n"
                           "nr_bursts 0\nburst_time 0\n")
        yield "cpuacct.usage", f"{usage_us * 1000}\n"
        return
    user_us = round(usage_us * USER_SHARE)
    yield "cpu.stat", (f"usage_usec {usage_us}\nuser_usec {user_us}\nsystem_usec {usage_us - user_us}\n"
                       f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_usec {throttled_us}\n"
                       "nr_bursts 0\nburst_usec 0\n")
    yield "io.pressure", pressure(spec.io_some_avg10, elapsed)
    yield "memory.pressure", pressure(spec.memory_some_avg10, elapsed)


def pressure(some: float, elapsed: float) -> str:
    """A PSI file whose averages have stood at `some` % (and `full` at half that) for `elapsed` seconds."""
    return "".join(
        f"{kind} avg10={share:.2f} avg60={share:.2f} avg300={share:.2f} total={round(share / 100 * elapsed * 1e6)}\n"
        for kind, share in (("some", some), ("full", some / 2))
    )


def quota_files(spec: Workload) -> Dict[str, str]:
    """The files of a cgroup's CPU limit, which stay as written."""
    quota_us = None if spec.cpu_quota is None else round(spec.cpu_quota * PERIOD_US)
    if spec.version == 1:
        return {"cpu.cfs_quota_us": f"{-1 if quota_us is None else quota_us}\n", "cpu.cfs_period_us": f"{PERIOD_US}\n"}
    return {"cpu.max": f"{'max' if quota_us is None else quota_us} {PERIOD_US}\n"}


class CgroupTree:
    """The cgroups of `workloads` under `<sysfs_root>/fs/cgroup`."""

    def __init__(self, sysfs_root: Path, workloads: List[Workload]) -> None:
        self.sysfs_root = sysfs_root
        self.root = sysfs_root / "fs" / "cgroup"
        self.workloads = [(spec, self.directory(spec)) for spec in workloads]
        self._written: Dict[Path, str] = {}

    def directory(self, spec: Workload) -> Path:
        """Where a workload's cgroup is: its path under the v2 root, or under the v1 cpu hierarchy."""
        return (self.root if spec.version == 2 else self.root / V1_CPU) / spec.path.lstrip("/")

    def build(self, now: float) -> Path:
        """Write the whole tree as it is at scenario time `now`; return the cgroup root."""
        self.root.mkdir(parents=True, exist_ok=True)
        versions = {spec.version for spec, _ in self.workloads}
        if 2 in versions or not versions:
            (self.root / "cgroup.controllers").write_text(CONTROLLERS)
        if 1 in versions:
            for name in V1_LINKS:
                os.symlink(V1_CPU, self.root / name)
        for spec, directory in self.workloads:
            directory.mkdir(parents=True, exist_ok=True)
            for name, text in quota_files(spec).items():
                (directory / name).write_text(text)
        for path, text in self._changed(now):
            path.write_text(text)
        return self.root

    def update(self, now: float) -> int:
        """Bring the counters to scenario time `now`; return how many files were rewritten."""
        changed = self._changed(now)
        staging = self.sysfs_root / ".cgroup-staging"
        for path, text in changed:
            # Written beside the tree, then renamed over the file: a reader finds the old text or the new.
            staging.write_text(text)
            os.replace(staging, path)
        return len(changed)

    def _changed(self, now: float) -> List[Tuple[Path, str]]:
        changed = []
        for spec, directory in self.workloads:
            for name, text in cgroup_files(spec, now):
                path = directory / name
                if self._written.get(path) != text:
                    self._written[path] = text
                    changed.append((path, text))
        return changed
