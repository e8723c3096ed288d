"""The Slurm jobs on a node and the GPUs each was given, from the host's cgroup tree: every job, whether
or not any of its processes runs on a GPU. Real files in tmp dirs, laid out as Slurm lays them out.
"""

import logging
import os
import shutil
from pathlib import Path

import pytest
import yaml

from gpu_monitoring.node.hardware import HardwareReader
from gpu_monitoring.node.slurm_jobs import SEARCH_EVERY, SlurmJobReader, device_list_gpus, gpu_ids
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.node import simulated_node
from gpu_monitoring.simulator.proc_root import build_proc_root
from gpu_monitoring.simulator.scenario import resolve
from gpu_monitoring.snapshot import Node, SlurmAllocation, SlurmJob

V2_SCOPE = "fs/cgroup/system.slice/slurmstepd.scope"
V1_ROOT = "fs/cgroup/{}/slurm/uid_1001/job_{}"
JOB_ENV = {"SLURM_JOB_ID": "3385", "SLURM_JOB_NAME": "train", "SLURM_JOB_USER": "alice",
           "SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_GPUS": "0,1",
           "CUDA_VISIBLE_DEVICES": "0,1"}
TRAIN = SlurmJob("3385", uid=1001, name="train", partition="gpu", account="nlp", user="alice")
# A whitelist as the devices controller lists one (kernel Documentation/admin-guide/cgroup-v1/devices.rst):
# /dev/null, zero, urandom, the pseudo-terminals, nvidiactl (195:255), nvidia-modeset (195:254),
# nvidia-uvm (a major given at load), then the job's GPUs.
WHITELIST = "c 1:3 rwm\nc 1:5 rwm\nc 1:9 rwm\nc 136:* rwm\nc 195:255 rwm\nc 195:254 rwm\nc 508:0 rwm\n"


class Host:
    """A host's sysfs root (its cgroup tree under fs/cgroup) and proc root, written as the test goes."""

    def __init__(self, tmp_path: Path):
        self.sys, self.proc = tmp_path / "sys", tmp_path / "proc"
        self.proc.mkdir()

    def cgroup(self, path: str, *pids: int) -> Path:
        """A cgroup under the sysfs root holding `pids`."""
        directory = self.sys / path
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))
        return directory

    def process(self, pid: int, environ=None, uid: int = 1001, name: str = "python") -> None:
        build_proc_root(self.proc, [{"pid": pid, "name": name, "cgroup": "0::/\n", "uid": uid,
                                     "environ": environ or {"PATH": "/usr/bin"}}])

    def unreadable_environ(self, pid: int) -> None:
        """An environ open() fails on even for root: a directory where the file should be."""
        path = self.proc / str(pid) / "environ"
        path.unlink()
        path.mkdir()

    def v2_job(self, job_id: str, pid: int, environ) -> None:
        """A job as cgroup_v2.html ("Hierarchy overview") shows job_3385: its step's tasks in `user`, slurmstepd
        in the step's `slurm`, an ssh session adopted into the extern step."""
        step = f"{V2_SCOPE}/job_{job_id}/step_0"
        self.cgroup(f"{step}/slurm", pid + 100)
        self.process(pid + 100, name="slurmstepd", uid=0)
        self.cgroup(f"{V2_SCOPE}/job_{job_id}/step_extern/user/task_special", pid + 200)
        self.process(pid + 200, name="bash")
        self.cgroup(f"{step}/user/task_0", pid)
        self.process(pid, dict(environ, SLURM_JOB_ID=job_id))

    def reader(self) -> SlurmJobReader:
        return SlurmJobReader(str(self.sys), str(self.proc))


@pytest.fixture
def host(tmp_path):
    host = Host(tmp_path)
    host.cgroup(f"{V2_SCOPE}/system", 4000)  # `slurmstepd infinity` (cgroup_v2.html), no job's
    return host


@pytest.mark.parametrize("text, expected", [
    ("0,1", [0, 1]), ("0-3,5", [0, 1, 2, 3, 5]), ("6", [6]), ("5,2-3", [2, 3, 5]),
    ("", None), ("NoDevFiles", None), ("0-", None), ("a-3", None),
])
def test_slurm_id_lists(text, expected):
    assert gpu_ids(text) == expected


@pytest.mark.parametrize("text, expected", [
    (WHITELIST + "c 195:0 rwm\nc 195:1 rwm\n", [0, 1]),
    (WHITELIST + "c 195:7 rw\n", [7]),
    (WHITELIST, []),  # a job given no GPU: nvidiactl and nvidia-modeset are none
    ("a *:* rwm\n", None),  # allows by default: the file says nothing of what is denied
    ("c 1:3 rwm\nc 195:* rwm\n", None),
    ("c *:* m\nc 195:0 rwm\n", None),
    ("b 195:0 rwm\n", []),  # a block device of that major is no GPU
])
def test_devices_list(text, expected):
    assert device_list_gpus(text) == expected


def test_a_v2_job_is_read_from_a_task_environment(host):
    host.v2_job("3385", 51001, JOB_ENV)
    assert host.reader().read() == [SlurmAllocation(TRAIN, [0, 1])]


def test_step_gpus_and_ranges(host):
    environ = {key: value for key, value in JOB_ENV.items() if key != "SLURM_JOB_GPUS"}
    host.v2_job("3385", 51001, dict(environ, SLURM_STEP_GPUS="0-3,5"))
    host.v2_job("3390", 51010, dict(environ, SLURM_JOB_GPUS="6", SLURM_STEP_GPUS="7"))
    found = {allocation.job.job_id: allocation.gpu_minors for allocation in host.reader().read()}
    assert found == {"3385": [0, 1, 2, 3, 5], "3390": [6]}


def test_a_job_running_nothing_on_its_gpu_is_listed(host):
    """The job's batch shell runs on no GPU: its cgroup and environment alone say it holds GPU 6."""
    host.v2_job("3391", 54410, dict(JOB_ENV, SLURM_JOB_GPUS="6"))
    (allocation,) = host.reader().read()
    assert allocation.job.job_id == "3391" and allocation.gpu_minors == [6]


def test_v1_gpus_come_from_devices_list(host, caplog):
    """cgroup v1 with ConstrainDevices: the job's devices.list, even where no environment can be read;
    the UID from the path (NordicHPC/sonar's `/slurm/uid_2101171/job_280678/step_interactive/task_0` layout)."""
    shutil.rmtree(host.sys)
    for controller in ("freezer", "devices", "cpuset"):
        host.cgroup(V1_ROOT.format(controller, "280678") + "/step_interactive", 61000)
    (host.sys / V1_ROOT.format("devices", "280678") / "devices.list").write_text(WHITELIST + "c 195:3 rwm\n")
    host.process(61000, dict(JOB_ENV, SLURM_JOB_ID="280678"))
    host.unreadable_environ(61000)
    with caplog.at_level(logging.INFO, logger="gpu_monitoring.node.slurm_jobs"):
        assert host.reader().read() == [SlurmAllocation(SlurmJob("280678", uid=1001), [3])]
    assert "CAP_SYS_PTRACE" in caplog.text


def test_v1_unconstrained_devices_fall_back_to_the_environment(host):
    shutil.rmtree(host.sys)
    host.cgroup(V1_ROOT.format("freezer", "3385") + "/step_batch", 61000)
    host.cgroup(V1_ROOT.format("devices", "3385") + "/step_batch/task_0", 61000)
    (host.sys / V1_ROOT.format("devices", "3385") / "devices.list").write_text("a *:* rwm\n")
    host.process(61000, JOB_ENV, uid=4242)
    assert host.reader().read() == [SlurmAllocation(TRAIN, [0, 1])]


def test_several_slurmd_name_their_cgroups_after_the_node(host):
    os.rename(host.sys / V2_SCOPE, host.sys / V2_SCOPE.replace("slurmstepd", "gpu-a17_slurmstepd"))
    host.cgroup(V2_SCOPE.replace("slurmstepd", "gpu-a17_slurmstepd") + "/job_3385/step_0/user/task_0", 51001)
    host.process(51001, JOB_ENV)
    assert host.reader().read() == [SlurmAllocation(TRAIN, [0, 1])]


def test_a_job_is_read_once_and_dropped_when_it_goes(host):
    host.v2_job("3385", 51001, JOB_ENV)
    reader = host.reader()
    first = reader.read()
    # What a known job's files say now goes unread: its GPUs cannot change while it runs.
    host.process(51001, dict(JOB_ENV, SLURM_JOB_GPUS="7"))
    assert reader.read() == first
    shutil.rmtree(host.sys / V2_SCOPE / "job_3385")
    assert reader.read() == []
    # The same ID again (another cluster's, or the reader's cache kept past its job) is read anew.
    host.v2_job("3385", 51001, dict(JOB_ENV, SLURM_JOB_GPUS="7"))
    assert reader.read() == [SlurmAllocation(TRAIN, [7])]


def test_a_job_with_no_process_yet_is_read_again(host):
    """slurmstepd makes a job's cgroups before it starts the tasks."""
    host.cgroup(f"{V2_SCOPE}/job_3385/step_0/user/task_0")
    reader = host.reader()
    assert reader.read() == []
    host.v2_job("3385", 51001, JOB_ENV)
    assert reader.read() == [SlurmAllocation(TRAIN, [0, 1])]


def test_unreadable_environments_leave_v2_gpus_unknown_and_say_so_once(host, caplog):
    for job_id, pid in (("3385", 51001), ("3386", 51002)):
        host.v2_job(job_id, pid, JOB_ENV)
        host.unreadable_environ(pid)
    with caplog.at_level(logging.INFO, logger="gpu_monitoring.node.slurm_jobs"):
        found = host.reader().read()
    assert found == [SlurmAllocation(SlurmJob("3385", uid=1001), []), SlurmAllocation(SlurmJob("3386", uid=1001), [])]
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "CAP_SYS_PTRACE" in record.getMessage()


def test_no_slurm_is_none_until_slurmd_starts(tmp_path, host):
    assert SlurmJobReader(str(tmp_path / "nowhere"), None).read() is None
    shutil.rmtree(host.sys / V2_SCOPE)
    host.cgroup("fs/cgroup/system.slice/sshd.service", 800)
    reader = host.reader()
    assert reader.read() is None
    host.cgroup(V2_SCOPE)  # slurmd started: Slurm, and no job yet; seen at the next search
    assert [reader.read() for _ in range(SEARCH_EVERY)] == [None] * (SEARCH_EVERY - 1) + [[]]


def test_a_restarted_slurmd_is_found_at_once(host):
    host.v2_job("3385", 51001, JOB_ENV)
    reader = host.reader()
    assert reader.read() == [SlurmAllocation(TRAIN, [0, 1])]
    scope = host.sys / V2_SCOPE
    os.rename(scope, scope.with_name("gpu-a17_slurmstepd.scope"))
    assert reader.read() == [SlurmAllocation(TRAIN, [0, 1])]


def test_the_simulated_hpc_node_shows_the_job_that_runs_nothing_on_its_gpu(node):
    """Through the check: job 48255 holds GPU 6, and only its shell runs, on no GPU."""
    check = node("hpc-slurm").check
    found = {allocation.job.job_id: allocation for allocation in check.source.read().node.slurm_allocations}
    assert {job_id: allocation.gpu_minors for job_id, allocation in found.items()} == {
        "48213": [0, 1, 2, 3], "48230": [4], "48241": [5], "48255": [6]}
    assert found["48255"].job == SlurmJob("48255", uid=1004, name="ablation-sweep", partition="gpu",
                                          account="nlp", user="dave")
    shell = Path(check.derived.proc_root) / "54410"
    assert (shell / "comm").read_text() == "bash\n"
    assert "SLURM_JOB_GPUS=6\0CUDA_VISIBLE_DEVICES=0\0" in (shell / "environ").read_text()


def test_a_simulated_v1_node_gives_minor_numbers_from_devices_list(tmp_path):
    """cgroup v1, several slurmd, and GPUs whose minor numbers are not their indices."""
    scenario = yaml.safe_load(Path(resolve("hpc-slurm")).read_text())
    scenario["slurm"].update(cgroup_version=1, nodename="gpu-a17")
    scenario["devices"][6]["minor_number"], scenario["devices"][2]["minor_number"] = 2, 6
    path = tmp_path / "hpc-v1.yaml"
    path.write_text(yaml.safe_dump(scenario))
    simulated = simulated_node(str(path), SimClock(speed=0))
    options = simulated.start(serve_kubernetes=False)
    try:
        node = Node()
        HardwareReader(options["sysfs_root"], options["proc_root"]).read_into(node)
        devices = Path(options["sysfs_root"]) / "fs/cgroup/devices/slurm_gpu-a17/uid_1004/job_48255/devices.list"
        assert "c 195:2 rwm" in devices.read_text()
        shell = (Path(options["proc_root"]) / "54410" / "environ").read_text()
    finally:
        simulated.stop()
    assert {a.job.job_id: a.gpu_minors for a in node.slurm_allocations} == {
        "48213": [0, 1, 3, 6], "48230": [4], "48241": [5], "48255": [2]}
    assert "SLURM_JOB_GPUS=2\0" in shell and "CUDA_VISIBLE_DEVICES=0\0" in shell
