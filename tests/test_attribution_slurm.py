"""Slurm jobs as workloads (scenario hpc-slurm): eight A100s, no Kubernetes, four jobs.

Each job's processes sit in its step's cgroup v2 path with its environment in the proc root; a
job is a workload like a pod, per job and GPU, with its own tags and none of a pod's. A job holds
the GPUs Slurm gave it (its environment's SLURM_JOB_GPUS) whether or not it runs on them.
"""

import os
from pathlib import Path

import pytest

from gpu_monitoring.cli.main import main

from .attribution_support import POD_TAGS, funnel, processes
from .conftest import tag_dict

PRICE = 2.50  # the scenario's A100 price, standing in for the instance's hourly_price
# job id: its tags on every workload series, its step, {gpu index: pid, None where it runs nothing there}
JOBS = {
    "48213": ({"slurm_job_name": "llama3-8b-pretrain", "slurm_user": "alice", "slurm_uid": "1001",
               "slurm_account": "nlp", "slurm_partition": "gpu"}, "0", {0: 51001, 1: 51002, 2: 51003, 3: 51004}),
    "48230": ({"slurm_job_name": "gromacs-lysozyme", "slurm_user": "bob", "slurm_uid": "1002",
               "slurm_account": "biochem", "slurm_partition": "gpu"}, "batch", {4: 52110}),
    "48241": ({"slurm_job_name": "jupyter", "slurm_user": "carol", "slurm_uid": "1003",
               "slurm_account": "vision", "slurm_partition": "gpu-interactive"}, "interactive", {5: 53377}),
    "48255": ({"slurm_job_name": "ablation-sweep", "slurm_user": "dave", "slurm_uid": "1004",
               "slurm_account": "nlp", "slurm_partition": "gpu"}, "batch", {6: None}),
}
IDLE_JOB, IDLE_GPU = "48241", 5
IDLE = {(IDLE_GPU, IDLE_JOB), (6, "48255")}  # held idle: running nothing, or nothing at all
FREE = {7}
HELD = {(index, job): pid for job, (_, _, gpus) in JOBS.items() for index, pid in gpus.items()}
SLURM_KEYS = {"slurm_job_id", "slurm_job_name", "slurm_user", "slurm_uid", "slurm_account", "slurm_partition"}


@pytest.fixture
def hpc(node):
    return node("hpc-slurm").run(2)


def jobs(node, metric):
    """{(gpu index, slurm job id): value} of a workload metric."""
    return node.keyed(metric, lambda t: (int(t["gpu_index"]), t.get("slurm_job_id")))


def job_tags(job):
    return dict(JOBS[job][0], slurm_job_id=job)


def slurm_tags(tags):
    return {key: value for key, value in tag_dict(tags).items() if key.startswith("slurm_")}


def test_the_fleet_funnel(hpc):
    utilization = hpc.values("utilization.gpu")
    # A100s have no GPM: effective goes by utilization.gpu; the batch job's GPU runs below 50 %.
    assert {index for index, value in utilization.items() if value >= 50} == {0, 1, 2, 3}
    # Allocated: Slurm gave it to a job; active: it ran kernels.
    assert funnel(hpc) == {"total": 8, "allocated": 7, "active": 5, "effective": 4}
    assert hpc.series("fleet.devices.allocatable") == []  # no device plugin off Kubernetes


def test_one_workload_per_job_and_gpu(hpc):
    assert jobs(hpc, "workload.gpus") == dict.fromkeys(HELD, 1.0)
    assert jobs(hpc, "workload.idle") == {key: int(key in IDLE) for key in HELD}
    sm = jobs(hpc, "workload.sm_utilization")
    process_sm = {pid: stub.value for pid, stub in processes(hpc, "process.sm_utilization").items()}
    assert sm == {key: process_sm.get(pid, 0.0) for key, pid in HELD.items()}
    assert all(sm[key] == 0 for key in IDLE) and all(value > 0 for key, value in sm.items() if key not in IDLE)
    # The idle job holds its GPU's memory all the same.
    assert jobs(hpc, "workload.memory.used")[(IDLE_GPU, IDLE_JOB)] == 21000 * 1024 * 1024


def test_job_costs(hpc):
    assert jobs(hpc, "workload.cost.hourly") == dict.fromkeys(HELD, PRICE)
    assert jobs(hpc, "workload.cost.idle_hourly") == {
        key: PRICE if key in IDLE else 0.0 for key in HELD
    }
    assert hpc.values("cost.idle_hourly") == {i: PRICE if i in FREE | {gpu for gpu, _ in IDLE} else 0.0
                                              for i in range(8)}


def test_workload_series_carry_the_jobs_tags_and_no_pods(hpc):
    for stub in hpc.series("workload.gpus"):
        tags = tag_dict(stub.tags)
        job = tags["slurm_job_id"]
        assert slurm_tags(stub.tags) == job_tags(job)  # the job's, not its step's
        assert int(tags["gpu_index"]) in JOBS[job][2]
        assert not set(tags) & set(POD_TAGS), stub.tags


def test_process_series_carry_job_and_step(hpc):
    memory = processes(hpc, "process.memory.used")
    assert set(memory) == set(HELD.values()) - {None}
    for (index, job), pid in HELD.items():
        if pid is None:
            continue
        tags = tag_dict(memory[pid].tags)
        assert tags["gpu_index"] == str(index)
        assert slurm_tags(memory[pid].tags) == dict(job_tags(job), slurm_step=JOBS[job][1])


def test_a_gpu_one_job_holds_carries_its_tags_and_a_free_one_none(hpc, aggregator):
    for index in range(8):
        (stub,) = [s for s in hpc.series("utilization.gpu") if tag_dict(s.tags)["gpu_index"] == str(index)]
        job = next((job for (gpu, job) in HELD if gpu == index), None)
        assert slurm_tags(stub.tags) == (job_tags(job) if job else {}), (index, stub.tags)
    for stub in aggregator.service_checks("gpu_monitoring.device.health"):
        if int(tag_dict(stub.tags)["gpu_index"]) in FREE:
            assert slurm_tags(stub.tags) == {}


def test_unreadable_environment_leaves_four_tags_out(node):
    hpc = node("hpc-slurm")
    # A directory where the file should be: open() fails as it does for an Agent without CAP_SYS_PTRACE.
    environ = Path(hpc.check.derived.proc_root) / str(HELD[(IDLE_GPU, IDLE_JOB)]) / "environ"
    os.remove(environ)
    os.mkdir(environ)
    hpc.run(2)
    (stub,) = [s for s in hpc.series("workload.idle") if tag_dict(s.tags).get("slurm_job_id") == IDLE_JOB]
    assert slurm_tags(stub.tags) == {"slurm_job_id": IDLE_JOB, "slurm_uid": "1003"}
    assert stub.value == 1
    assert hpc.check.warnings == []
    # The other jobs' environments are read as before.
    others = {tag_dict(s.tags)["slurm_job_id"]: s for s in hpc.series("workload.gpus")}
    assert slurm_tags(others["48230"].tags) == job_tags("48230")


def test_no_pod_or_slurm_tags_outside_the_jobs_series(hpc, aggregator):
    for name in aggregator.metric_names:
        for stub in aggregator.metrics(name):
            tags = tag_dict(stub.tags)
            assert not set(tags) & set(POD_TAGS), (name, stub.tags)
            if name.startswith("gpu_monitoring.fleet.") or name == "gpu_monitoring.devices.count":
                assert not set(tags) & SLURM_KEYS, (name, stub.tags)


def test_the_demo_prints_each_jobs_cost(capsys):
    assert main(["check", "--simulate", "hpc-slurm"]) == 0
    section = capsys.readouterr().out.split("=== Workload cost")[1].split("\n\n")[0]
    for job, (tags, _, gpus) in JOBS.items():
        idle = PRICE * len(gpus) if any(key[1] == job for key in IDLE) else 0.0
        expected = f"slurm job {job} ({tags['slurm_job_name']})"
        (row,) = [line for line in section.splitlines() if line.startswith(expected)]
        assert row.split()[-3:] == [str(len(gpus)), f"${PRICE * len(gpus):,.2f}/h", f"${idle:,.2f}/h"], row
