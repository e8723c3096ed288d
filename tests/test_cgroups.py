"""A workload's cgroup, as the kernel lays it out on cgroup v1 and v2, and its processes' states.

The trees (tests/data/cgroup-workloads/tree-*.txt) are transcripts of the shell commands that list a
host's /sys/fs/cgroup, made into files by tests.sysfs_support; the `.cgroup` files beside them are the
`/proc/<pid>/cgroup` texts of those workloads' processes: `containerd-v2-other-cgroupns` as a reader in a
guaranteed pod's container, in a cgroup namespace of its own, sees a best-effort pod's container
(kernel Documentation/admin-guide/cgroup-v2.rst, "The Root and Views"). Counters move between two reads
as the kernel moves them, by rewriting the files; the reader's clock is the test's.
"""

import logging
import os
import shutil
from pathlib import Path

import pytest
import yaml

from gpu_monitoring.node.cgroup_paths import CgroupPaths, cgroup_line, systemd_slice_path
from gpu_monitoring.node.cgroups import (
    FORGET_AFTER,
    QUOTA_EVERY,
    WorkloadCgroups,
    parse_cfs_quota,
    parse_cpu_max,
    some_avg10,
)
from gpu_monitoring.node.procfs import process_owner, workload_path
from gpu_monitoring.simulator.proc_root import build_proc_root, kernel_stat
from gpu_monitoring.simulator.scenario import resolve
from gpu_monitoring.snapshot import CgroupUse, Process

from .sysfs_support import materialize

DATA = Path(__file__).parent / "data"
WORKLOADS = DATA / "cgroup-workloads"

LIMITED_POD = "kubepods-burstable-podd5dd46ff_f0a0_5afa_ae37_69ac526fc1f9.slice"
LIMITED = (f"/kubepods.slice/kubepods-burstable.slice/{LIMITED_POD}/"
           "cri-containerd-84bce27582c90aa7ad9a0eb0d37d6cd3dc821737db5d7d86023e03db8327e8b7.scope")
STALLING = ("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0debe36e_5688_58fe_af51_0ecb7591c154"
            ".slice/cri-containerd-5ccf2a32c5b4663d858219b661df362eb139d8deb5b0036e7a2392bfc629f43b.scope")
DOCKER = "/system.slice/docker-b508e2673897c4f521d858f56dab18e31ddbfc1f83300fb9793c8a4052af8f05.scope"
JOB_V2 = "/system.slice/slurmstepd.scope/job_48213"
V1_CONTAINER = ("/kubepods/burstable/podb929266d-fc93-5169-8ea5-688120bda571/"
                "7073cb611177ff9537503833a83b25a74038af35569d1e2a2ef1a92db4cfeb37")
JOB_V1 = "/slurm/uid_1001/job_48213"
SEPARATE = "/docker/e8f14fa67ed5dd5b2bd98248bb54984f887e24dc24226b1ca3dfabb196bddecf"


# The recorded trees' counters 15 s (v2), 10 s (v1) and 20 s (v1 apart) later, as the kernel moves them.
V2_LIMITED_LATER = ("usage_usec 183532313211\nuser_usec 171260000000\nsystem_usec 12272313211\n"
                    "core_sched.force_idle_usec 0\nnr_periods 1204668\nnr_throttled 746894\n"
                    "throttled_usec 91240000000\nnr_bursts 0\nburst_usec 0\n")
V2_STALLING_LATER = ("usage_usec 9213877310\nuser_usec 7198420911\nsystem_usec 2015456399\n"
                     "core_sched.force_idle_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\nnr_bursts 0\n"
                     "burst_usec 0\n")
V1_STAT_LATER = "nr_periods 482311\nnr_throttled 160770\nthrottled_time 6429780113254\n"
V1_USAGE_LATER = "79137920033871\n"
SEPARATE_USAGE_LATER = "3340472096115\n"
SEPARATE_STAT_LATER = "nr_periods 90410\nnr_throttled 0\nthrottled_time 0\nnr_bursts 0\nburst_time 0\n"


def tree(tmp_path, name):
    """A recorded tree made under tmp_path/sys, which stands for /sys; returns the sysfs root."""
    return str(materialize(os.path.join("..", "cgroup-workloads", f"{name}.txt"), tmp_path / "sys"))


def text(case):
    """A process's `/proc/<pid>/cgroup`: this test's own files, else the project's container hosts' and Slurm's."""
    for directory in (WORKLOADS, DATA / "cgroup", DATA / "slurm-cgroup"):
        if (directory / f"{case}.cgroup").exists():
            return (directory / f"{case}.cgroup").read_text()
    raise FileNotFoundError(case)


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def write(sysfs, path, name, content, hierarchy=""):
    """Rewrite a cgroup's file, as the kernel's counters move."""
    Path(sysfs, "fs", "cgroup", hierarchy, path.lstrip("/"), name).write_text(content)


def processes(*cgroups):
    return [Process(pid=1000 + n, used_memory=0, kind="compute", cgroup=cgroup) for n, cgroup in enumerate(cgroups)]


# --- where a workload's cgroup is -------------------------------------------------------------------


@pytest.mark.parametrize("case, version, expected", [
    ("containerd-v2-systemd-limited", 2, LIMITED),
    ("docker-v2-systemd", 2, DOCKER),
    # crun's `container` sub-cgroup and a podman pod's slice: the container's own scope
    ("podman-v2-systemd", 2, "/machine.slice/libpod-a2bc7b153f034b17f358cde43a7f8c7475147e8a0d1b2573c26473244ec44ce4"
                             ".scope"),
    ("podman-v2-pod", 2, "/machine.slice/machine-libpod_pod_ddf44d54b520f0b4469fcd01c3155ca49e6911dc2175471eb3a7b78918"
                         "7a7a89.slice/libpod-1dadda571b14eefb3158a15d0fff7e0089f9dd92f922679ed0116cccdfe8bb0f.scope"),
    ("containerd-v2-cgroupfs", 2, "/default/3f1a8c52e0b6d9f47a2c81e5b0d3c6f9a4e7b2d1c0f8e5a3b6d9c2f1e4a7b0c3"),
    # cgroup v1: the cpu,cpuacct hierarchy's line, not the hybrid unified `0::` one
    ("containerd-v1-kubepods-cgroupfs", 1, V1_CONTAINER),
    ("docker-v1-hybrid", 1, "/docker/a2ffe0e97ac22657a2a023ad628e9df837c38a03b1ebc904d3f6d644eb1a1a81"),
    ("docker-v1-separate-cpu", 1, SEPARATE),
    # Slurm: the job's cgroup, above its steps and tasks
    ("v2-batch", 2, "/system.slice/slurmstepd.scope/job_17"),
    ("v2-multiple-slurmd", 2, "/system.slice/slurm-worker-1_slurmstepd.scope/job_4749"),
    ("v1-interactive", 1, "/slurm/uid_2101171/job_280678"),
    ("v1-some-controllers", 1, None),  # its cpu,cpuacct line is at /slurm, no job's
    # no workload: a host service, a container's monitor, slurmstepd's own cgroup
    ("host-v2-service", 2, None),
    ("host-v2-hex-service", 2, None),
    ("podman-v2-conmon", 2, None),
    ("v2-stepd", 2, None),
])
def test_the_path_is_cut_at_the_workloads_own_directory(case, version, expected):
    assert workload_path(cgroup_line(text(case), version) or "") == expected


def test_a_namespace_relative_path_is_placed_by_its_slice_name(tmp_path):
    paths = CgroupPaths(tree(tmp_path, "tree-v2-systemd"))
    assert paths.workload(text("containerd-v2-other-cgroupns")) == STALLING


def test_a_namespace_relative_path_without_a_slice_is_looked_for_below_the_root(tmp_path):
    # `/../docker-<id>.scope`: one level up from the reader's root, which is system.slice here.
    paths = CgroupPaths(tree(tmp_path, "tree-v2-systemd"))
    assert paths.workload(text("docker-v2-other-cgroupns")) == DOCKER


def test_a_path_found_nowhere_is_none_and_said_once(tmp_path, caplog):
    paths = CgroupPaths(tree(tmp_path, "tree-v2-systemd"))
    gone = "0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod0debe36e_5688_58fe_af51_0ecb7591c155.slice/" \
           "cri-containerd-" + "9" * 64 + ".scope\n"
    caplog.set_level(logging.DEBUG, logger="gpu_monitoring.node.cgroup_paths")
    assert paths.workload(gone) is None
    assert paths.workload(gone) is None
    assert len([r for r in caplog.records if "nowhere" in r.getMessage()]) == 1


def test_the_host_path_is_used_as_it_is(tmp_path):
    paths = CgroupPaths(tree(tmp_path, "tree-v2-systemd"))
    assert paths.workload(text("containerd-v2-systemd-limited")) == LIMITED
    assert paths.workload(text("host-v2-service")) is None


def test_a_v1_host_reads_the_cpu_hierarchys_line(tmp_path):
    paths = CgroupPaths(tree(tmp_path, "tree-v1-cgroupfs"))
    assert paths.workload(text("containerd-v1-kubepods-cgroupfs")) == V1_CONTAINER


def test_systemd_slice_names_spell_their_place():
    assert systemd_slice_path("kubepods-besteffort-podab_cd.slice") == [
        "kubepods.slice", "kubepods-besteffort.slice", "kubepods-besteffort-podab_cd.slice"]
    assert systemd_slice_path("-.slice") == []
    assert systemd_slice_path("docker-ab.scope") is None


def test_a_process_owner_carries_its_workloads_cgroup(tmp_path):
    sysfs = tree(tmp_path, "tree-v2-systemd")
    proc_root = build_proc_root(tmp_path / "proc", [
        {"pid": 7, "name": "python3", "cgroup": text("containerd-v2-other-cgroupns")},
        {"pid": 8, "name": "sshd", "cgroup": text("host-v2-service")},
    ])
    cgroup_of = CgroupPaths(sysfs).workload
    assert process_owner(str(proc_root), 7, cgroup_of).cgroup == STALLING
    assert process_owner(str(proc_root), 8, cgroup_of).cgroup is None
    assert process_owner(str(proc_root), 7).cgroup is None  # not asked for


# --- what it shows ------------------------------------------------------------------------------------


def test_v2_throttling_and_cpu_use_over_two_reads(tmp_path):
    sysfs, clock = tree(tmp_path, "tree-v2-systemd"), Clock()
    reader = WorkloadCgroups(sysfs, None, clock)
    first = reader.read(processes(LIMITED, STALLING, LIMITED))
    assert first[LIMITED] == CgroupUse(2, None, None, 4.0, 0.0, 0.0)
    # 15 s later: 150 periods, 93 of them throttled, 59.4 s of CPU.
    clock.now += 15
    write(sysfs, LIMITED, "cpu.stat", V2_LIMITED_LATER)
    write(sysfs, STALLING, "cpu.stat", V2_STALLING_LATER)
    second = reader.read(processes(LIMITED, STALLING))
    assert second[LIMITED].throttled == pytest.approx(62.0)
    assert second[LIMITED].usage_cores == pytest.approx(3.96)
    # No quota: no enforcement period elapsed, none throttled.
    assert second[STALLING] == CgroupUse(2, 0.0, pytest.approx(0.8), None, 38.52, 0.31)


def test_a_slurm_jobs_cgroup_on_v2(tmp_path):
    reader = WorkloadCgroups(tree(tmp_path, "tree-v2-systemd"), None, Clock())
    assert reader.read(processes(JOB_V2))[JOB_V2] == CgroupUse(2, None, None, None, 0.0, 12.4)


def test_v1_through_the_links_to_the_co_mounted_hierarchy(tmp_path):
    sysfs, clock = tree(tmp_path, "tree-v1-cgroupfs"), Clock()
    assert os.path.islink(os.path.join(sysfs, "fs", "cgroup", "cpu"))
    reader = WorkloadCgroups(sysfs, None, clock)
    first = reader.read(processes(V1_CONTAINER, JOB_V1))
    assert first == {V1_CONTAINER: CgroupUse(1, None, None, 2.0, None, None),
                     JOB_V1: CgroupUse(1, None, None, None, None, None)}
    clock.now += 10
    # 100 periods, a third throttled; 19.5 s of CPU in nanoseconds.
    write(sysfs, V1_CONTAINER, "cpu.stat", V1_STAT_LATER, "cpu,cpuacct")
    write(sysfs, V1_CONTAINER, "cpuacct.usage", V1_USAGE_LATER, "cpu,cpuacct")
    second = reader.read(processes(V1_CONTAINER))
    assert second[V1_CONTAINER] == CgroupUse(1, pytest.approx(33.0), pytest.approx(1.95), 2.0, None, None)


def test_v1_co_mounted_without_links(tmp_path):
    sysfs = tree(tmp_path, "tree-v1-cgroupfs")
    for name in ("cpu", "cpuacct"):
        os.unlink(os.path.join(sysfs, "fs", "cgroup", name))
    reader = WorkloadCgroups(sysfs, None, Clock())
    assert reader.read(processes(V1_CONTAINER))[V1_CONTAINER].quota_cores == 2.0


def test_v1_cpu_and_cpuacct_mounted_apart(tmp_path):
    sysfs, clock = tree(tmp_path, "tree-v1-separate"), Clock()
    reader = WorkloadCgroups(sysfs, None, clock)
    assert reader.read(processes(SEPARATE))[SEPARATE] == CgroupUse(1, None, None, 1.5, None, None)
    clock.now += 20
    write(sysfs, SEPARATE, "cpuacct.usage", SEPARATE_USAGE_LATER, "cpuacct")
    write(sysfs, SEPARATE, "cpu.stat", SEPARATE_STAT_LATER, "cpu")
    assert reader.read(processes(SEPARATE))[SEPARATE] == CgroupUse(1, 0.0, pytest.approx(1.5), 1.5, None, None)


def test_the_quota_is_read_again_once_a_minute(tmp_path):
    sysfs, clock = tree(tmp_path, "tree-v2-systemd"), Clock()
    reader = WorkloadCgroups(sysfs, None, clock)
    reader.read(processes(LIMITED))
    write(sysfs, LIMITED, "cpu.max", "800000 100000\n")
    clock.now += QUOTA_EVERY / 2
    assert reader.read(processes(LIMITED))[LIMITED].quota_cores == 4.0
    clock.now += QUOTA_EVERY / 2
    assert reader.read(processes(LIMITED))[LIMITED].quota_cores == 8.0
    write(sysfs, LIMITED, "cpu.max", "max 100000\n")
    clock.now += QUOTA_EVERY
    assert reader.read(processes(LIMITED))[LIMITED].quota_cores is None


def test_counters_that_went_back_and_a_cgroup_forgotten_start_over(tmp_path):
    sysfs, clock = tree(tmp_path, "tree-v2-systemd"), Clock()
    reader = WorkloadCgroups(sysfs, None, clock)
    reader.read(processes(DOCKER))
    clock.now += 15
    assert reader.read(processes(DOCKER))[DOCKER].usage_cores == 0.0
    clock.now += 15
    write(sysfs, DOCKER, "cpu.stat", "usage_usec 12\nnr_periods 0\nnr_throttled 0\n")  # another cgroup, same path
    assert reader.read(processes(DOCKER))[DOCKER].usage_cores is None
    clock.now += 15
    assert reader.read(processes(DOCKER))[DOCKER].usage_cores == 0.0
    clock.now += FORGET_AFTER
    reader.read(processes(LIMITED))  # the docker container ran no GPU process meanwhile
    clock.now += 15
    assert reader.read(processes(DOCKER))[DOCKER].usage_cores is None


def test_a_cgroup_that_went_is_left_out(tmp_path):
    sysfs = tree(tmp_path, "tree-v2-systemd")
    shutil.rmtree(os.path.join(sysfs, "fs", "cgroup", DOCKER.lstrip("/")))
    assert WorkloadCgroups(sysfs, None, Clock()).read(processes(DOCKER, LIMITED)).keys() == {LIMITED}


@pytest.mark.parametrize("content, cores", [
    ("max 100000", None), ("400000 100000", 4.0), ("150000 100000", 1.5), ("", None), (None, None)])
def test_cpu_max(content, cores):
    assert parse_cpu_max(content) == cores


@pytest.mark.parametrize("quota, period, cores", [("-1", 100000, None), ("250000", 100000, 2.5), ("50000", 50000, 1.0),
                                                  (None, 100000, None), ("100000", None, None)])
def test_cfs_quota(quota, period, cores):
    assert parse_cfs_quota(quota, period) == cores


def test_psi_some_avg10():
    lines = (WORKLOADS / "tree-v2-systemd.txt").read_text().splitlines()
    recorded = "\n".join(line.partition(":")[2] for line in lines if STALLING + "/io.pressure" in line)
    assert some_avg10(recorded) == 38.52
    assert some_avg10("full avg10=1.00 avg60=0.00 avg300=0.00 total=1\n") is None
    assert some_avg10("some avg10=x avg60=0.00") is None
    assert some_avg10(None) is None


# --- processes' states, the host's CPUs, an unreadable tree --------------------------------------------


def test_each_process_state_is_read_each_run_and_a_lasting_d_is_stuck(tmp_path):
    proc_root = build_proc_root(tmp_path / "proc", [
        {"pid": 1000, "name": "python3 (worker)", "state": "Z"},
        {"pid": 1001, "name": "python3", "state": "D"},
        {"pid": 1002, "name": "python3"},
    ], boot_time=1_700_000_000)
    reader = WorkloadCgroups(tree(tmp_path, "tree-v2-systemd"), str(proc_root), Clock())
    listed = processes(None, None, None, None)  # pid 1003 is gone
    reader.read(listed)
    # Uninterruptible sleep is told only where it lasts from one run to the next: any IO passes through it.
    assert [process.state for process in listed] == ["Z", None, "S", None]
    again = processes(None, None, None, None)
    reader.read(again)
    assert [process.state for process in again] == ["Z", "D", "S", None]
    assert reader.cpu_cores == 4


def test_the_host_cpu_count_is_its_cpu_lines(tmp_path):
    (tmp_path / "stat").write_text(kernel_stat(1_700_000_000).replace("cpu3 ", "cpu3 1 ") + "cpuidle 1\n")
    assert WorkloadCgroups(str(tmp_path), str(tmp_path), Clock()).cpu_cores == 4
    assert WorkloadCgroups(str(tmp_path), str(tmp_path / "none"), Clock()).cpu_cores is None


def test_an_unreadable_tree_gives_none_and_says_why_once(tmp_path, caplog):
    proc_root = build_proc_root(tmp_path / "proc", [{"pid": 1000, "name": "python3", "state": "D"}])
    (tmp_path / "sys").mkdir()
    reader = WorkloadCgroups(str(tmp_path / "sys"), str(proc_root), Clock())
    caplog.set_level(logging.INFO, logger="gpu_monitoring.node.cgroups")
    listed = processes(LIMITED)
    assert reader.read(listed) is None
    assert reader.read(listed) is None
    assert listed[0].state == "D"
    said = [r for r in caplog.records if "cgroup tree" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO and "No such file" in said[0].getMessage()


# --- the simulated node --------------------------------------------------------------------------------


def two_reads(simulated):
    """The node's snapshot after a read 15 s after a first one."""
    simulated.check.source.read()
    simulated.sim.advance(15)
    return simulated.check.source.read()


def process_of(snapshot, pid):
    return next(p for d in snapshot.devices for target in (d, *d.mig_instances) for p in target.processes
                if p.pid == pid)


def test_the_simulated_dgx_shows_jupyter_alice_throttled(node):
    snapshot = two_reads(node("dgx-h100"))
    cgroups = snapshot.node.cgroups
    alice = cgroups[process_of(snapshot, 71002).cgroup]
    assert alice.version == 2 and alice.quota_cores == 4.0
    assert alice.throttled == pytest.approx(62, abs=1)
    assert alice.usage_cores == pytest.approx(3.96, abs=0.1)
    assert cgroups[process_of(snapshot, 60211).cgroup].io_pressure == 38.5
    trainer = cgroups[process_of(snapshot, 80417).cgroup]  # CRI-O, cgroupfs driver
    assert trainer.throttled == 0.0 and trainer.quota_cores is None and trainer.io_pressure == 0.0
    # The process of the pod that failed still runs in its container's cgroup.
    assert process_of(snapshot, 90114).cgroup in cgroups
    # A state is read where the process ran no kernel: the failed pod's, not the notebook's.
    assert process_of(snapshot, 90114).state == "S" and process_of(snapshot, 71002).state is None
    assert snapshot.node.cpu_cores == 4


def test_a_simulated_v1_node(node, tmp_path):
    raw = yaml.safe_load(resolve("dgx-h100").read_text())
    for pod in raw["kubernetes"]["pods"]:
        for container in pod["containers"]:
            container["cgroup_version"] = 1
    raw["devices"][7]["processes"][0]["state"] = "D"
    path = tmp_path / "dgx-v1.yaml"
    path.write_text(yaml.safe_dump(raw))
    snapshot = two_reads(node(str(path)))
    alice = snapshot.node.cgroups[process_of(snapshot, 71002).cgroup]
    assert (alice.version, alice.quota_cores, alice.io_pressure) == (1, 4.0, None)
    assert alice.throttled == pytest.approx(62, abs=1)
    assert process_of(snapshot, 90114).state == "D"


def test_the_processes_of_mig_instances_have_their_workloads_cgroups(node):
    snapshot = two_reads(node("a100-mig"))
    on_instances = [p for d in snapshot.devices for m in d.mig_instances for p in m.processes if p.pod_uid]
    assert on_instances
    assert all(p.cgroup in snapshot.node.cgroups and p.state == "S" for p in on_instances)


@pytest.mark.parametrize("version, job_cgroup", [(2, "/system.slice/slurmstepd.scope/job_48213"),
                                                 (1, "/slurm/uid_1001/job_48213")])
def test_a_simulated_slurm_jobs_cgroup(node, tmp_path, version, job_cgroup):
    raw = yaml.safe_load(resolve("hpc-slurm").read_text())
    raw["slurm"]["cgroup_version"] = version
    raw["slurm"]["jobs"][0]["cgroup"] = {"cpu_quota": 16, "throttled_percent": 10, "cpu_cores_used": 12}
    path = tmp_path / f"slurm-v{version}.yaml"
    path.write_text(yaml.safe_dump(raw))
    snapshot = two_reads(node(str(path)))
    assert process_of(snapshot, 51001).cgroup == job_cgroup
    job = snapshot.node.cgroups[job_cgroup]
    assert (job.version, job.quota_cores, job.usage_cores) == (version, 16.0, pytest.approx(12.0))
    assert job.throttled == pytest.approx(10, abs=1)
