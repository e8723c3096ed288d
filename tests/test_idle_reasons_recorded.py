"""Each idle reason from recorded cgroup trees (tests/data/cgroup-workloads/, v1 and v2 as the kernel lays
them out): the files read over two runs, then the reason a workload idle on its GPU gets."""

from gpu_monitoring.attribution.holders import Holder
from gpu_monitoring.attribution.idle_reasons import explain
from gpu_monitoring.attribution.workloads import Workload
from gpu_monitoring.node.cgroups import WorkloadCgroups
from gpu_monitoring.snapshot import Node

from .test_cgroups import (
    JOB_V2,
    LIMITED,
    SEPARATE,
    SEPARATE_STAT_LATER,
    SEPARATE_USAGE_LATER,
    STALLING,
    V1_CONTAINER,
    V1_STAT_LATER,
    V1_USAGE_LATER,
    V2_LIMITED_LATER,
    V2_STALLING_LATER,
    Clock,
    processes,
    tree,
    write,
)


def idle_reasons(reader, clock, advance, cgroups):
    """Read, let the counters move (`advance`), read again, and explain an idle workload per cgroup."""
    reader.read(processes(*cgroups))
    clock.now += 15
    advance()
    running = processes(*cgroups)
    node = Node(cgroups=reader.read(running), cpu_cores=64)
    found = [Workload(target=(n, None), holder=Holder(("pod", "ml", f"p{n}", "main")), gpus=1.0, memory_used=0.0,
                      sm_utilization=0.0, sm_limit=None, idle=True, processes=[process])
             for n, process in enumerate(running)]
    explain(found, node, 50.0, {})
    return {process.cgroup: w.idle_reason for process, w in zip(running, found)}


def test_v2_a_throttled_container_one_stalling_on_io_and_a_job_with_no_cause(tmp_path):
    sysfs, clock = tree(tmp_path, "tree-v2-systemd"), Clock()

    def advance():
        write(sysfs, LIMITED, "cpu.stat", V2_LIMITED_LATER)
        write(sysfs, STALLING, "cpu.stat", V2_STALLING_LATER)

    reasons = idle_reasons(WorkloadCgroups(sysfs, None, clock), clock, advance, [LIMITED, STALLING, JOB_V2])
    # The job's memory pressure (12.4 %) is below the bound: nothing its cgroup shows explains it.
    assert reasons == {LIMITED: "cpu_throttled", STALLING: "io_wait", JOB_V2: "unknown"}


def test_v1_a_throttled_container(tmp_path):
    sysfs, clock = tree(tmp_path, "tree-v1-cgroupfs"), Clock()

    def advance():
        write(sysfs, V1_CONTAINER, "cpu.stat", V1_STAT_LATER, "cpu,cpuacct")
        write(sysfs, V1_CONTAINER, "cpuacct.usage", V1_USAGE_LATER, "cpu,cpuacct")

    assert idle_reasons(WorkloadCgroups(sysfs, None, clock), clock, advance, [V1_CONTAINER]) == {
        V1_CONTAINER: "cpu_throttled"}


def test_v1_a_container_using_all_its_quota(tmp_path):
    sysfs, clock = tree(tmp_path, "tree-v1-separate"), Clock()

    def advance():
        write(sysfs, SEPARATE, "cpuacct.usage", SEPARATE_USAGE_LATER, "cpuacct")
        write(sysfs, SEPARATE, "cpu.stat", SEPARATE_STAT_LATER, "cpu")

    assert idle_reasons(WorkloadCgroups(sysfs, None, clock), clock, advance, [SEPARATE]) == {SEPARATE: "cpu_saturated"}
