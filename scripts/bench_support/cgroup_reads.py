"""What telling why a held GPU idles costs a run: reading the cgroup of each workload that runs a GPU
process (CPU throttling, use and quota, IO and memory pressure) and each GPU process's state, on the
simulated dgx-h100, whose host cgroup tree lays its pods out as the kernel does; and listing the Slurm
jobs on the simulated hpc-slurm with the GPUs Slurm gave them. Files only, no NVML call."""

from typing import List

from gpu_monitoring.node.cgroups import WorkloadCgroups
from gpu_monitoring.node.slurm_jobs import SlurmJobReader
from gpu_monitoring.snapshot import Process, Snapshot

from .harness import Bench, median_ms, thread_times
from .report import Report, Table

LIMIT_MS = 0.3


def table(rounds: int, report: Report) -> Table:
    with Bench("dgx-h100") as bench:
        bench.warm_up(2)
        options = bench.check.derived
        processes = _processes(bench.check.source.read())
        workloads = WorkloadCgroups(options.sysfs_root, options.proc_root)
        cgroups = len(workloads.read(processes) or {})
        cgroup_ms = median_ms(thread_times(lambda: workloads.read(processes), rounds))
    with Bench("hpc-slurm") as bench:
        bench.warm_up(2)
        options = bench.check.derived
        jobs = SlurmJobReader(options.sysfs_root, options.proc_root)
        found = len(jobs.read() or ())
        slurm_ms = median_ms(thread_times(jobs.read, rounds))
    verdict = report.target(f"workload cgroups read per run (dgx-h100, {cgroups} cgroups)", cgroup_ms,
                            f"< {LIMIT_MS:g} ms", cgroup_ms < LIMIT_MS)
    return Table(
        f"Why held GPUs idle: own CPU per run, median of {rounds} reads",
        ["stage", "ms/run", "target"],
        [[f"dgx-h100: {cgroups} workload cgroups (cpu.stat, PSI; cpu.max now and then), {len(processes)} "
          "processes' state", cgroup_ms, verdict],
         [f"hpc-slurm: the Slurm jobs on the node ({found}), each job's GPUs read when it is first seen",
          slurm_ms, ""]],
        ["no NVML call: each figure is a small cgroup or procfs file; a process's cgroup is placed once, "
         "with its owner"],
    )


def _processes(snapshot: Snapshot) -> List[Process]:
    return [p for d in snapshot.devices for t in (d, *d.mig_instances) for p in t.processes]
