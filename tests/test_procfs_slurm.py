"""Processes to Slurm jobs: the job step from the cgroup file, the user from `status`, the job's
name, partition, account and user from `environ` where it is readable, each read once per process.
"""

import logging
import os
from dataclasses import asdict

import pytest

from gpu_monitoring.node.process_owners import ProcessOwners
from gpu_monitoring.node.procfs import (
    ProcessOwner,
    environment,
    parse_cgroup,
    process_owner,
    real_uid,
)
from gpu_monitoring.simulator.proc_root import build_proc_root, replace_process, slurm_cgroup_text
from gpu_monitoring.snapshot import Process, SlurmJob

SLURM_DATA = os.path.join(os.path.dirname(__file__), "data", "slurm-cgroup")
PID = 4711
OWN_UID = 4242  # the `Uid:` the proc root gives every process here

# Real `/proc/<pid>/cgroup` files of Slurm job steps and of Slurm's own daemons, with the source
# each was taken from (IDs kept); where a source gives the layout rather than a file, the file
# follows it. (job, step, uid) from the path; uid None where cgroup v2 names none.
SLURM_CASES = [
    # slurm.schedmd.com/cgroup_v2.html, "Hierarchy overview": job_3385's step_0, extern and interactive steps
    ("v2-step", ("3385", "0", None)),
    ("v2-extern", ("3385", "extern", None)),
    ("v2-interactive", ("3385", "interactive", None)),
    # cgroup_v2.html, "Working at the task level": pids added to a step but to no task
    ("v2-task-special", ("3385", "0", None)),
    # a public test quoting /proc/self/cgroup on CSCS's Alps (proctrack/cgroup), and its batch step
    ("v2-numbered-step", ("4530470", "75", None)),
    ("v2-batch", ("17", "batch", None)),
    # NVIDIA/enroot#169: Debian 11, Slurm 23.02, built with several slurmd per host (node name prefix)
    ("v2-multiple-slurmd", ("4749", "0", None)),
    # stackhpc/slurm-k8s-cluster#38: slurmd in a pod puts its scope under the pod's cgroup
    ("v2-slurmd-in-pod", ("212", "0", None)),
    # NordicHPC/sonar (src/slurm.rs): `10:devices:/slurm/uid_2101171/job_280678/step_interactive/task_0`
    ("v1-interactive", ("280678", "interactive", 2101171)),
    # a public test of Slurm on Rocky 8 (cgroup v1): cpuset and memory at the batch step
    ("v1-batch", ("195428", "batch", 1000)),
    # the same Alps test: freezer at the step, memory at the task, the unified `0::` line elsewhere
    ("v1-hybrid", ("17", "0", 1000)),
    # a public test: only some controllers go below `/slurm`
    ("v1-some-controllers", ("1870", "0", 1000)),
    # plazonic/cgroup_exporter#5, ceems-dev/ceems#284: `/slurm_<nodename>/uid_…` with several slurmd
    ("v1-multiple-slurmd", ("90211", "0", 5012)),
    # Slurm's own processes, no job's (cgroup_v2.html, "slurmd startup", "Troubleshooting startup")
    ("v2-stepd", None),  # slurmstepd: [3385.0] in its step's `slurm` cgroup
    ("v2-stepd-infinity", None),  # `slurmstepd infinity` in the scope's `system` waiting area
    ("v2-slurmd", None),
    ("v2-slurmd-manual", None),
    ("v2-not-slurm", None),  # `job_` and `step_` that are not below a slurmstepd scope
]


def write_process(proc_root, pid=PID, cgroup=None, case=None, **process):
    """One process in a real proc root under tmp_path, its cgroup file from the data or given."""
    if case is not None:
        with open(os.path.join(SLURM_DATA, f"{case}.cgroup"), encoding="utf-8") as f:
            cgroup = f.read()
    entry = dict({"pid": pid, "name": "python", "uid": OWN_UID}, **process)
    build_proc_root(proc_root, [dict(entry, cgroup=cgroup)])
    return str(proc_root)


@pytest.mark.parametrize("case, expected", [pytest.param(*case, id=case[0]) for case in SLURM_CASES])
def test_slurm_job_from_the_cgroup(tmp_path, case, expected):
    owner = process_owner(write_process(tmp_path, case=case), PID)
    assert owner.slurm == (None if expected is None else SlurmJob(*expected))


def test_every_slurm_cgroup_file_has_a_case():
    assert {name.removesuffix(".cgroup") for name in os.listdir(SLURM_DATA)} == {case for case, _ in SLURM_CASES}


def test_slurmd_in_a_pod_keeps_its_pod():
    with open(os.path.join(SLURM_DATA, "v2-slurmd-in-pod.cgroup"), encoding="utf-8") as f:
        text = f.read()
    assert parse_cgroup(text) == ProcessOwner(None, "a101c1c8-1589-4313-acf5-02e3ca8d3994", SlurmJob("212", "0"))


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("nodename", [None, "gpu-a17"])
@pytest.mark.parametrize("step", ["0", "batch", "extern", "interactive"])
def test_built_slurm_process_round_trips(tmp_path, version, nodename, step):
    text = slurm_cgroup_text(90211, step, uid=5012, task=3, cgroup_version=version, nodename=nodename)
    owner = process_owner(write_process(tmp_path, cgroup=text), PID)
    assert owner == ProcessOwner(None, None, SlurmJob("90211", step, 5012 if version == 1 else None))


def test_cgroup_v2_takes_the_processs_real_uid(tmp_path):
    proc_root = write_process(tmp_path, case="v2-step", uid=1003)
    assert real_uid(proc_root, PID) == 1003
    assert ProcessOwners(proc_root).identify(PID).owner.slurm.uid == 1003


def test_cgroup_v1_uid_is_the_paths(tmp_path):
    # The path names the job's user; a process that changed its own UID is still that user's job.
    proc_root = write_process(tmp_path, case="v1-interactive", uid=0)
    assert ProcessOwners(proc_root).identify(PID).owner.slurm.uid == 2101171


JOB_ENV = {
    "SLURM_JOB_ID": "3385", "SLURM_JOB_NAME": "llama pretrain=v2", "SLURM_JOB_PARTITION": "gpu",
    "SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_USER": "alice", "HOME": "/home/alice",
}


def test_readable_environment_names_the_job(tmp_path):
    proc_root = write_process(tmp_path, case="v2-step", environ=JOB_ENV)
    assert environment(proc_root, PID) == JOB_ENV  # split at the first "=" only
    assert ProcessOwners(proc_root).identify(PID).owner.slurm == SlurmJob(
        "3385", "0", OWN_UID, name="llama pretrain=v2", partition="gpu", account="nlp", user="alice"
    )


@pytest.mark.parametrize("environ", [{}, {"PATH": "/usr/bin"}], ids=["empty", "no-slurm-variables"])
def test_environment_without_the_variables_adds_nothing(tmp_path, environ):
    proc_root = write_process(tmp_path, case="v2-batch", environ=environ)
    assert ProcessOwners(proc_root).identify(PID).owner.slurm == SlurmJob("17", "batch", OWN_UID)


def test_missing_environ_is_quiet(tmp_path, caplog):
    proc_root = write_process(tmp_path, case="v2-step")
    os.remove(os.path.join(proc_root, str(PID), "environ"))
    with caplog.at_level(logging.DEBUG):
        assert ProcessOwners(proc_root).identify(PID).owner.slurm == SlurmJob("3385", "0", OWN_UID)
    assert caplog.records == []


def unreadable_environ(proc_root, pid):
    """An environ open() fails on even for root: a directory where the file should be."""
    path = os.path.join(proc_root, str(pid), "environ")
    os.remove(path)
    os.mkdir(path)


def test_unreadable_environ_leaves_the_tags_out_and_says_so_once(tmp_path, caplog):
    proc_root = str(tmp_path)
    for pid in (PID, PID + 1):
        write_process(tmp_path, pid=pid, case="v2-step", environ=JOB_ENV)
        unreadable_environ(proc_root, pid)
    owners = ProcessOwners(proc_root)
    with caplog.at_level(logging.INFO, logger="gpu_monitoring.node.process_owners"):
        found = [owners.identify(pid).owner for pid in (PID, PID + 1)]
    assert [owner.slurm for owner in found] == [SlurmJob("3385", "0", OWN_UID)] * 2
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "CAP_SYS_PTRACE" in record.getMessage()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads files whatever their mode")
def test_environ_of_another_user_is_a_permission_error(tmp_path):
    proc_root = write_process(tmp_path, case="v2-step", environ=JOB_ENV)
    os.chmod(os.path.join(proc_root, str(PID), "environ"), 0)
    with pytest.raises(PermissionError):
        environment(proc_root, PID)
    assert ProcessOwners(proc_root).identify(PID).owner.slurm == SlurmJob("3385", "0", OWN_UID)


def test_owner_is_read_once_per_process(tmp_path):
    proc_root = write_process(tmp_path, case="v2-step", environ=JOB_ENV, start_time=1000)
    owners = ProcessOwners(proc_root)
    first = owners.identify(PID).owner
    # The same process (pid and start time) is not read again: a changed file goes unseen.
    write_process(tmp_path, case="v2-batch", start_time=1000)
    owners.new_run()
    assert owners.identify(PID).owner == first
    # The pid reused by a new process, in a directory of its own: read again.
    with open(os.path.join(SLURM_DATA, "v2-batch.cgroup"), encoding="utf-8") as f:
        cgroup = f.read()
    replace_process(tmp_path, {"pid": PID, "name": "python", "uid": OWN_UID, "cgroup": cgroup, "start_time": 2000})
    owners.new_run()
    assert owners.identify(PID).owner.slurm == SlurmJob("17", "batch", OWN_UID)


def test_without_a_start_time_the_owner_is_read_every_time(tmp_path):
    proc_root = write_process(tmp_path, case="v2-step")
    os.remove(os.path.join(proc_root, str(PID), "stat"))
    owners = ProcessOwners(proc_root)
    assert owners.identify(PID).owner.slurm.job_id == "3385"
    write_process(tmp_path, case="v2-batch")
    os.remove(os.path.join(proc_root, str(PID), "stat"))
    owners.new_run()
    assert owners.identify(PID).owner.slurm.job_id == "17"


def test_vanished_process_has_no_owner(tmp_path):
    assert ProcessOwners(write_process(tmp_path, case="v2-step")).identify(PID + 1).owner is None


def test_snapshot_without_slurm_still_loads():
    # A sidecar older than the field sends processes without `slurm`.
    old = {"pid": 7, "used_memory": 1024, "kind": "compute", "name": "python"}
    assert Process.from_dict(old).slurm is None
    job = SlurmJob("3385", "0", 1001, name="x", partition="gpu", account="nlp", user="alice")
    process = Process(7, 1024, "compute", slurm=job)
    assert Process.from_dict(asdict(process)) == process
