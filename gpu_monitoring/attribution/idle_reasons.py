"""Why a workload holding a GPU (or a share, or a slice) sits idle or below `effective_threshold`: one
reason, the first that holds, from what its processes and its cgroup showed over the interval.

- no_process: it holds the GPU and runs nothing on it;
- cpu_throttled: its cgroup was throttled in at least THROTTLED % of its CPU periods (cgroup v2 and v1
  `cpu.stat` nr_throttled / nr_periods, kernel Documentation/admin-guide/cgroup-v2.rst "CPU Interface
  Files", Documentation/scheduler/sched-bwc.rst "Statistics");
- cpu_saturated: it uses SATURATED of its CPU quota, or of the node's cores where it has none;
- io_wait / memory_pressure: PSI's `some avg10` of its cgroup at least PRESSURE % (the share of the last
  ten seconds in which at least one of its tasks stalled on IO or memory, Documentation/accounting/psi.rst);
- zombie: GPU memory on the target is held by processes whose pod is finished (Succeeded or Failed), or
  that are defunct (Z) or stuck in uninterruptible sleep (D, told by node.cgroups where it lasted from one
  run to the next) (`/proc/<pid>/stat` field 3, proc(5));
- unknown: none of these.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional

from gpu_monitoring.attribution.holders import Holder
from gpu_monitoring.attribution.owners import ProcessOwners
from gpu_monitoring.attribution.targets import Target, TargetKey
from gpu_monitoring.attribution.workloads import Workload
from gpu_monitoring.snapshot import CgroupUse, Node, Process

THROTTLED = 20.0  # % of CPU periods
PRESSURE = 20.0  # PSI some avg10, %
SATURATED = 0.9  # of the quota, or of the node's cores
STUCK_STATES = {"Z": "defunct", "D": "stuck in uninterruptible sleep"}
GIB = 1024 ** 3


@dataclass(frozen=True)
class Zombie:
    """A process holding GPU memory after its owner is gone, and why it counts as one."""

    pid: int
    memory: float  # bytes
    why: str


def zombies(held: List[Target], owners: ProcessOwners) -> Dict[TargetKey, List[Zombie]]:
    """Each target's zombie processes: what the node shows of them, not who holds the target."""
    found: Dict[TargetKey, List[Zombie]] = {}
    for target in held:
        for process in target.processes:
            why = _zombie(process, owners.get((target.key, process.pid)))
            if why is not None:
                found.setdefault(target.key, []).append(Zombie(process.pid, float(process.used_memory or 0), why))
    return found


def _zombie(process: Process, owner: Optional[Holder]) -> Optional[str]:
    if process.state in STUCK_STATES:
        return STUCK_STATES[process.state]
    if owner is not None and owner.finished:
        return f"pod {owner.namespace}/{owner.pod} is {owner.phase}"
    return None


def explain(found: List[Workload], node: Node, threshold: float, on_target: Dict[TargetKey, List[Zombie]]) -> None:
    """Gives each workload its cgroup's figures, and a reason to each that holds a GPU (or a share) idle or
    below `threshold`; a process using a GPU it was not given holds none of it."""
    for workload in found:
        workload.cpu = _cgroup(workload, node)
        below = workload.sm_utilization is not None and workload.sm_utilization < threshold
        if workload.gpus and (workload.idle or below):
            workload.idle_reason = _reason(workload, node.cpu_cores, bool(on_target.get(workload.target)))


def _cgroup(workload: Workload, node: Node) -> Optional[CgroupUse]:
    paths = [p.cgroup for p in workload.processes if p.cgroup]
    return (node.cgroups or {}).get(paths[0]) if paths else None


def _reason(workload: Workload, cores: Optional[int], zombies_on_target: bool) -> str:
    if not workload.processes:
        return "no_process"
    cpu = workload.cpu or CgroupUse(version=0)
    found = [
        ("cpu_throttled", _at_least(cpu.throttled, THROTTLED)),
        ("cpu_saturated", _saturated(cpu, cores)),
        ("io_wait", _at_least(cpu.io_pressure, PRESSURE)),
        ("memory_pressure", _at_least(cpu.memory_pressure, PRESSURE)),
        ("zombie", zombies_on_target),
    ]
    return next((reason for reason, holds in found if holds), "unknown")


def _at_least(value: Optional[float], bound: float) -> bool:
    return value is not None and value >= bound


def _saturated(cpu: CgroupUse, cores: Optional[int]) -> bool:
    """At its quota, or without one at the node's cores."""
    bound = cpu.quota_cores or cores
    return bool(bound) and _at_least(cpu.usage_cores, SATURATED * bound)


def describe(found: List[Zombie]) -> str:
    """`pid 90114 (pod ml/x is Failed) holds 6.0 GiB`, one clause a process."""
    return "; ".join(f"pid {z.pid} ({z.why}) holds {z.memory / GIB:.1f} GiB" for z in found)
