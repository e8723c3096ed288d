"""One reason per idle workload, the first that holds, in the documented order; a workload using a GPU
it was not given holds none of it and gets none. Built from snapshot data, as the collectors leave it."""

import pytest

from gpu_monitoring.attribution.holders import Holder
from gpu_monitoring.attribution.idle_reasons import PRESSURE, SATURATED, THROTTLED, Zombie, explain, zombies
from gpu_monitoring.attribution.targets import Target
from gpu_monitoring.attribution.workloads import Workload
from gpu_monitoring.snapshot import CgroupUse, Device, Node, Process

CGROUP = "/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + "a" * 64 + ".scope"
TARGET = (0, None)


def workload(use=None, processes=1, idle=True, sm=0.0, gpus=1.0, state="S"):
    running = [Process(pid=100 + n, used_memory=1 << 30, kind="compute", cgroup=CGROUP, state=state)
               for n in range(processes)]
    return Workload(target=TARGET, holder=Holder(("pod", "ml", "train-7", "main")), gpus=gpus, memory_used=0.0,
                    sm_utilization=sm, sm_limit=None, idle=idle, processes=running), use


def reason(use=None, cores=64, zombies=False, **options):
    found, use = workload(use, **options)
    node = Node(cgroups={CGROUP: use} if use else {}, cpu_cores=cores)
    explain([found], node, 50.0, {TARGET: ["a zombie"]} if zombies else {})
    return found.idle_reason


@pytest.mark.parametrize("use, expected", [
    (CgroupUse(2, throttled=THROTTLED, usage_cores=1.0, quota_cores=4.0), "cpu_throttled"),
    (CgroupUse(2, throttled=THROTTLED - 1, usage_cores=SATURATED * 4, quota_cores=4.0), "cpu_saturated"),
    (CgroupUse(2, usage_cores=SATURATED * 64), "cpu_saturated"),  # no quota: the node's cores bound it
    (CgroupUse(2, usage_cores=8.0, io_pressure=PRESSURE), "io_wait"),
    (CgroupUse(2, usage_cores=8.0, memory_pressure=PRESSURE), "memory_pressure"),
    (CgroupUse(1, throttled=0.0, usage_cores=0.5, quota_cores=2.0), "unknown"),  # v1: no PSI to tell
    (None, "unknown"),
])
def test_the_first_reason_that_holds(use, expected):
    assert reason(use) == expected


def test_throttling_comes_before_pressure():
    assert reason(CgroupUse(2, throttled=90.0, quota_cores=1.0, io_pressure=80.0)) == "cpu_throttled"


def test_no_process_comes_first():
    assert reason(CgroupUse(2, throttled=90.0, quota_cores=1.0), processes=0) == "no_process"


def test_zombie_memory_on_the_target_when_nothing_else_explains_it():
    assert reason(CgroupUse(2, usage_cores=0.1), zombies=True) == "zombie"


def test_a_busy_workload_above_the_threshold_gets_none():
    assert reason(CgroupUse(2, throttled=90.0, quota_cores=1.0), idle=False, sm=80.0) is None


def test_below_the_threshold_is_explained_too():
    assert reason(CgroupUse(2, throttled=60.0, quota_cores=4.0), idle=False, sm=20.0) == "cpu_throttled"


def test_a_process_on_a_gpu_it_was_not_given_holds_none_of_it():
    assert reason(CgroupUse(2, throttled=90.0, quota_cores=1.0), gpus=0.0) is None


@pytest.mark.parametrize("state, phase, why", [
    ("Z", "Running", "defunct"),
    ("D", "Running", "stuck in uninterruptible sleep"),
    ("S", "Succeeded", "pod ml/train-7 is Succeeded"),
    ("S", "Running", None),
    (None, None, None),  # a process whose state could not be read, of a pod the kubelet does not list
])
def test_zombies_are_told_by_state_or_by_their_pods_phase(state, phase, why):
    found, _ = workload(state=state)
    process = found.processes[0]
    owner = Holder(("pod", "ml", "train-7", "main"), namespace="ml", pod="train-7", phase=phase)
    target = Target(TARGET, Device(index=0, uuid="GPU-0"), None, [process])
    stale = zombies([target], {(TARGET, process.pid): owner})
    assert stale == ({TARGET: [Zombie(process.pid, float(1 << 30), why)]} if why else {})
