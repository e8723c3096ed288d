"""Processes to containers and pods, from the cgroup files a node's kernel shows in /proc."""

import errno
import itertools
import logging
import os
import sys

import pytest

from gpu_monitoring.node.procfs import ProcessOwner, ProcessStat, fault_of, parse_cgroup, process_owner, process_stat
from gpu_monitoring.simulator.proc_root import build_proc_root, cgroup_text

CID = "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
NODE_CID = "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d"
POD = "bfb94fa2-fd07-465d-b01a-e70b3dd0d2a0"
POD_ESCAPED = "bfb94fa2_fd07_465d_b01a_e70b3dd0d2a0"  # as the systemd driver writes it
STATIC_POD = "a81259cef8e959c624df1d456e5d3297"  # a static pod's UID: a hash, no dashes
HOST = ProcessOwner(None, None)

BURSTABLE_SLICE = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_ESCAPED}.slice"
BESTEFFORT_SLICE = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_ESCAPED}.slice"
GUARANTEED_SLICE = f"/kubepods.slice/kubepods-pod{POD_ESCAPED}.slice"


def v1(path: str) -> str:
    """A hybrid cgroup v1 file: hierarchies the runtime leaves alone (misc, rdma, the unified `0::`) stay at /."""
    controllers = ["name=systemd", "cpu,cpuacct", "blkio", "memory", "devices", "freezer", "net_cls,net_prio",
                   "perf_event", "cpuset", "pids", "hugetlb"]
    lines = ["13:misc:/", "12:rdma:/"] + [f"{11 - i}:{name}:{path}" for i, name in enumerate(reversed(controllers))]
    return "\n".join(lines + ["0::/"]) + "\n"


CONTAINER_CASES = [
    # containerd, systemd driver
    pytest.param(f"0::{BURSTABLE_SLICE}/cri-containerd-{CID}.scope\n", POD, id="v2-systemd-containerd-burstable"),
    pytest.param(f"0::{BESTEFFORT_SLICE}/cri-containerd-{CID}.scope\n", POD, id="v2-systemd-containerd-besteffort"),
    pytest.param(f"0::{GUARANTEED_SLICE}/cri-containerd-{CID}.scope\n", POD, id="v2-systemd-containerd-guaranteed"),
    pytest.param(v1(f"{BURSTABLE_SLICE}/cri-containerd-{CID}.scope"), POD, id="v1-systemd-containerd-burstable"),
    pytest.param(v1(f"{GUARANTEED_SLICE}/cri-containerd-{CID}.scope"), POD, id="v1-systemd-containerd-guaranteed"),
    # containerd, cgroupfs driver
    pytest.param(f"0::/kubepods/burstable/pod{POD}/{CID}\n", POD, id="v2-cgroupfs-containerd-burstable"),
    pytest.param(f"0::/kubepods/besteffort/pod{POD}/{CID}\n", POD, id="v2-cgroupfs-containerd-besteffort"),
    pytest.param(f"0::/kubepods/pod{POD}/{CID}\n", POD, id="v2-cgroupfs-containerd-guaranteed"),
    pytest.param(v1(f"/kubepods/besteffort/pod{POD}/{CID}"), POD, id="v1-cgroupfs-containerd-besteffort"),
    pytest.param(v1(f"/kubepods/pod{POD}/{CID}"), POD, id="v1-cgroupfs-containerd-guaranteed"),
    # CRI-O
    pytest.param(f"0::{BURSTABLE_SLICE}/crio-{CID}.scope\n", POD, id="v2-systemd-crio-burstable"),
    pytest.param(f"0::{GUARANTEED_SLICE}/crio-{CID}.scope/container\n", POD, id="v2-systemd-crio-crun-subgroup"),
    pytest.param(v1(f"{BESTEFFORT_SLICE}/crio-{CID}.scope"), POD, id="v1-systemd-crio-besteffort"),
    pytest.param(f"0::/kubepods/burstable/pod{POD}/crio-{CID}\n", POD, id="v2-cgroupfs-crio-burstable"),
    pytest.param(v1(f"/kubepods/pod{POD}/crio-{CID}"), POD, id="v1-cgroupfs-crio-guaranteed"),
    # docker under the kubelet, and docker alone
    pytest.param(v1(f"{BURSTABLE_SLICE}/docker-{CID}.scope"), POD, id="v1-systemd-docker-burstable"),
    pytest.param(v1(f"/kubepods/besteffort/pod{POD}/{CID}"), POD, id="v1-cgroupfs-docker-besteffort"),
    pytest.param(f"0::/system.slice/docker-{CID}.scope\n", None, id="v2-systemd-docker-standalone"),
    pytest.param(v1(f"/docker/{CID}"), None, id="v1-cgroupfs-docker-standalone"),
    # the innermost pod wins: kind runs the kubelet inside a docker container
    pytest.param(
        f"0::/system.slice/docker-{NODE_CID}.scope/kubelet.slice/kubelet-kubepods.slice/"
        f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{POD_ESCAPED}.slice/"
        f"cri-containerd-{CID}.scope\n",
        POD,
        id="v2-kind-nested",
    ),
    # an exited process not yet reaped still names its (removed) cgroup
    pytest.param(f"0::{BURSTABLE_SLICE}/cri-containerd-{CID}.scope (deleted)\n", POD, id="v2-deleted-cgroup"),
]


@pytest.mark.parametrize("text, pod_uid", CONTAINER_CASES)
def test_container_process(text, pod_uid):
    assert parse_cgroup(text) == ProcessOwner(CID, pod_uid)


def test_systemd_escaped_pod_uid_gets_its_dashes_back():
    owner = parse_cgroup(f"0::{BURSTABLE_SLICE}/cri-containerd-{CID}.scope\n")
    assert owner.pod_uid == "bfb94fa2-fd07-465d-b01a-e70b3dd0d2a0"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{STATIC_POD}.slice/cri-containerd-{CID}.scope\n",
            id="systemd",
        ),
        pytest.param(v1(f"/kubepods/burstable/pod{STATIC_POD}/{CID}"), id="cgroupfs"),
    ],
)
def test_static_pod_uid(text):
    assert parse_cgroup(text) == ProcessOwner(CID, STATIC_POD)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"0::{BURSTABLE_SLICE}/crio-conmon-{CID}.scope\n", id="v2-systemd-pod-slice"),
        pytest.param(f"0::/system.slice/crio-conmon-{CID}.scope\n", id="v2-systemd-system-slice"),
        pytest.param(v1(f"/kubepods/besteffort/pod{POD}/crio-conmon-{CID}"), id="v1-cgroupfs"),
    ],
)
def test_crio_conmon_is_no_container_process(text):
    assert parse_cgroup(text) == HOST


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("0::/user.slice/user-1000.slice/session-4.scope\n", id="v2-login-session"),
        pytest.param("0::/system.slice/nvidia-persistenced.service\n", id="v2-service"),
        pytest.param("0::/system.slice/containerd.service\n", id="v2-runtime-daemon"),
        pytest.param("0::/init.scope\n", id="v2-init"),
        pytest.param("0::/\n", id="v2-root"),
        pytest.param(v1("/user.slice/user-1000.slice/session-4.scope"), id="v1-login-session"),
        pytest.param(v1("/system.slice/dcgm.service"), id="v1-service"),
        pytest.param("4:memory:/process_api/82bbd1d936d96c63150bdd4d0c67c62a\n1:cpu:/\n0::/\n", id="v1-not-an-id"),
        pytest.param("", id="empty"),
    ],
)
def test_host_process(text):
    assert parse_cgroup(text) == HOST


def test_vanished_process_is_none_and_quiet(tmp_path, caplog):
    proc_root = build_proc_root(tmp_path, [{"pid": 100, "name": "python3"}])
    with caplog.at_level(logging.DEBUG):
        assert process_owner(str(proc_root), 4242) is None
        assert process_stat(str(proc_root), 4242) is None
    assert caplog.records == []


def test_missing_proc_root_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        process_owner(str(tmp_path / "host" / "proc"), 100)
    with pytest.raises(FileNotFoundError):
        process_stat(str(tmp_path / "host" / "proc"), 100)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_cgroup_is_an_error(tmp_path):
    proc_root = build_proc_root(tmp_path, [{"pid": 100, "name": "python3"}])
    (proc_root / "100" / "cgroup").chmod(0)
    with pytest.raises(PermissionError):
        process_owner(str(proc_root), 100)


def test_name_and_start_time_come_from_one_read_of_stat(tmp_path):
    process = {"pid": 31337, "name": "pt_main (x) y", "container_id": CID, "pod_uid": POD, "start_time": 987654}
    proc_root = build_proc_root(tmp_path, [process])
    assert process_stat(str(proc_root), 31337) == ProcessStat("pt_main (x) y", 987654)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs a real /proc")
def test_real_proc_root():
    assert isinstance(process_owner("/proc", os.getpid()), ProcessOwner)
    with open(f"/proc/{os.getpid()}/comm", encoding="utf-8") as f:
        assert process_stat("/proc", os.getpid()).name == f.read().rstrip("\n")


@pytest.mark.parametrize(
    "runtime, driver, version, qos",
    itertools.product(
        ("containerd", "crio", "docker"), ("systemd", "cgroupfs"), (1, 2), ("burstable", "besteffort", "guaranteed")
    ),
)
def test_built_pod_process_round_trips(tmp_path, runtime, driver, version, qos):
    process = {"pid": 2048, "name": "python", "container_id": CID, "pod_uid": POD, "qos": qos,
               "runtime": runtime, "cgroup_driver": driver, "cgroup_version": version, "memory_mib": 4096}
    proc_root = build_proc_root(tmp_path, [process])
    assert process_owner(str(proc_root), 2048) == ProcessOwner(CID, POD)


@pytest.mark.parametrize("driver, version", itertools.product(("systemd", "cgroupfs"), (1, 2)))
def test_built_standalone_docker_process_round_trips(tmp_path, driver, version):
    process = {"pid": 7, "name": "trainer", "container_id": CID, "runtime": "docker", "cgroup_driver": driver,
               "cgroup_version": version}
    proc_root = build_proc_root(tmp_path, [process])
    assert process_owner(str(proc_root), 7) == ProcessOwner(CID, None)


@pytest.mark.parametrize("unit", [None, "nvidia-persistenced.service"])
@pytest.mark.parametrize("version", [1, 2])
def test_built_host_process_round_trips(tmp_path, unit, version):
    process = {"pid": 1, "name": "nv-hostengine", "unit": unit, "cgroup_version": version}
    proc_root = build_proc_root(tmp_path, [process])
    assert process_owner(str(proc_root), 1) == HOST
    expected_slice = "/system.slice/" if unit else "/user.slice/"
    assert expected_slice in (proc_root / "1" / "cgroup").read_text()


def test_raw_cgroup_text_is_written_as_is(tmp_path):
    text = f"0::{BURSTABLE_SLICE}/crio-conmon-{CID}.scope\n"
    proc_root = build_proc_root(tmp_path, [{"pid": 3, "name": "conmon", "cgroup": text}])
    assert (proc_root / "3" / "cgroup").read_text() == text
    assert process_owner(str(proc_root), 3) == HOST


def test_built_text_looks_like_the_kernels():
    assert cgroup_text(CID, POD) == f"0::{BURSTABLE_SLICE}/cri-containerd-{CID}.scope\n"
    assert cgroup_text(CID, POD, qos="guaranteed", runtime="crio", cgroup_driver="cgroupfs") == (
        f"0::/kubepods/pod{POD}/crio-{CID}\n"
    )
    lines = cgroup_text(CID, POD, qos="besteffort", cgroup_driver="cgroupfs", cgroup_version=1).splitlines()
    assert lines[0] == "12:rdma:/"
    assert lines[-1] == f"1:name=systemd:/kubepods/besteffort/pod{POD}/{CID}"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"container_id": CID, "pod_uid": POD, "qos": "burst"}, "qos must be one of"),
        ({"container_id": CID, "pod_uid": POD, "runtime": "podman"}, "runtime must be one of"),
        ({"container_id": CID, "pod_uid": POD, "cgroup_driver": "cgroupv2"}, "cgroup_driver must be one of"),
        ({"container_id": CID, "pod_uid": POD, "cgroup_version": 3}, "cgroup_version must be 1 or 2"),
        ({"container_id": "abc123", "pod_uid": POD}, "container_id must be 64"),
        ({"container_id": CID, "pod_uid": "training-pod"}, "pod_uid must be"),
        ({"container_id": CID}, "needs the pod_uid"),
        ({"pod_uid": POD}, "needs the container_id"),
    ],
)
def test_cgroup_text_rejects_what_no_node_shows(options, message):
    with pytest.raises(ValueError, match=message):
        cgroup_text(**options)


# Real `/proc/<pid>/cgroup` files of container hosts without Kubernetes, one per runtime, cgroup
# version and driver, as the threads quoting them show them (IDs kept); where a source gives the
# layout rather than a file, the file follows it with an ID of its own.
CGROUP_DATA = os.path.join(os.path.dirname(__file__), "data", "cgroup")
UBUNTU_DOCKER = "31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30"
V2_DOCKER = "b508e2673897c4f521d858f56dab18e31ddbfc1f83300fb9793c8a4052af8f05"
CRUN_PODMAN = "a2bc7b153f034b17f358cde43a7f8c7475147e8a0d1b2573c26473244ec44ce4"
NERDCTL = "3f1a8c52e0b6d9f47a2c81e5b0d3c6f9a4e7b2d1c0f8e5a3b6d9c2f1e4a7b0c3"

CONTAINER_HOST_CASES = [
    # neuvector/neuvector share/system/cgroup_test.go, TestDockerIDUbuntu
    ("docker-v1-cgroupfs", UBUNTU_DOCKER),
    # neuvector/neuvector share/system/cgroup_test.go, TestDockerIDCentOS
    ("docker-v1-systemd", "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d"),
    # docker/for-linux#1293: hybrid hierarchy, the unified line left on containerd.service
    ("docker-v1-hybrid", "a2ffe0e97ac22657a2a023ad628e9df837c38a03b1ebc904d3f6d644eb1a1a81"),
    # neuvector/neuvector share/system/cgroup_test.go, TestDockerIDRancherOS: docker in docker, inner wins
    ("docker-v1-nested", "ec08435e04266c5ba381fccbb829f626d11d8ddf5f8f547263c7a2d79ab4787a"),
    # dalance/procs#236
    ("docker-v2-systemd", V2_DOCKER),
    # moby cmd/dockerd/daemon_systemd_unix.go (cgroupfs parent `docker`), docker/docs#11042 (v2 path)
    ("docker-v2-cgroupfs", V2_DOCKER),
    # docker/docs#14545: rootless docker's scope under the user's systemd manager
    ("docker-v2-rootless", V2_DOCKER),
    # cgroup_namespaces(7): read from another cgroup namespace, `..` per ancestor outside its root
    ("docker-v2-other-cgroupns", V2_DOCKER),
    # containers/podman#10602 (its `0::` line is cut off in the thread): systemd's `init.scope` below
    ("podman-v1-systemd", "2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24"),
    # falcosecurity/libs#1613: crun's `container` sub-cgroup
    ("podman-v2-systemd", CRUN_PODMAN),
    # containers/podman#20423: podman run under root's user manager
    ("podman-v2-user-manager", "cf21d19260ace8544fe8b769fc2638bf2c0873dfbfff0b6253f0569b26a1d5eb"),
    # containers/podman#29582: rootless podman
    ("podman-v2-rootless", CRUN_PODMAN),
    # containers/podman#13673: a podman pod's slice, and `--cgroups=split` (Quadlet's default) in a service
    ("podman-v2-pod", "1dadda571b14eefb3158a15d0fff7e0089f9dd92f922679ed0116cccdfe8bb0f"),
    ("podman-v2-split", "c4e8e0d642078c90dde4a8a65883a7c0bee26f751d7c6a3096dc322519c658d3"),
    # falcosecurity/plugins#1378: nerdctl on systemd-managed containerd
    ("nerdctl-v2-systemd", NERDCTL),
    # containerd/nerdctl#5182: rootless scopes are the user manager's
    ("nerdctl-v2-rootless", NERDCTL),
    # containerd/containerd#1617 (`/<namespace>/<id>`), containerd/nerdctl#60 (namespace default, cgroupfs)
    ("containerd-v1-cgroupfs", NERDCTL),
    ("containerd-v2-cgroupfs", NERDCTL),
    ("containerd-v2-k8s-namespace", NERDCTL),
    # processes of the host, container monitors included: no container
    ("podman-v2-conmon", None),  # falcosecurity/libs#1613: conmon beside the container it watches
    ("podman-v2-split-conmon", None),  # containers/podman#13673: `--cgroups=split` puts conmon in `runtime`
    ("host-v1-all-root", None),  # neuvector/neuvector share/system/cgroup_test.go, TestHostProcess
    ("host-v2-login-session", None),
    ("host-v2-service", None),
    ("host-v2-init", None),
    ("host-v2-docker-service", None),  # dalance/procs#236: docker-proxy and the shims
    ("host-v2-podman-unshare", None),  # containers/crun#376: podman's own scope, named after its PID
    ("host-v2-hex-service", None),  # a unit named with 64 hex digits but no runtime's prefix
    ("host-v2-uuid-service", None),  # systemd escapes a UUID's dashes in unit names
]


def _proc_root_with_cgroup(tmp_path, case: str, pid: int = 4711) -> str:
    process = tmp_path / "proc" / str(pid)
    process.mkdir(parents=True)
    with open(os.path.join(CGROUP_DATA, f"{case}.cgroup"), encoding="utf-8") as f:
        (process / "cgroup").write_text(f.read())
    return str(tmp_path / "proc")


@pytest.mark.parametrize("case, container_id", [pytest.param(*case, id=case[0]) for case in CONTAINER_HOST_CASES])
def test_container_host_process(tmp_path, case, container_id):
    assert process_owner(_proc_root_with_cgroup(tmp_path, case), 4711) == ProcessOwner(container_id, None)


def test_every_cgroup_file_has_a_case():
    cases = {case for case, _ in CONTAINER_HOST_CASES}
    assert {name.removesuffix(".cgroup") for name in os.listdir(CGROUP_DATA)} == cases


def test_unreadable_cgroups_are_faults_of_the_file_not_the_process(tmp_path):
    proc_root = build_proc_root(tmp_path, [{"pid": 100, "name": "a"}, {"pid": 200, "name": "b"}])
    (proc_root / "100" / "cgroup").unlink()
    (proc_root / "100" / "cgroup").mkdir()
    loop = proc_root / "200" / "cgroup"
    loop.unlink()
    os.symlink(loop, loop)
    faults = []
    for pid in (100, 200):
        with pytest.raises(OSError) as raised:
            process_owner(str(proc_root), pid)
        faults.append(fault_of(str(proc_root), pid, raised.value))
    assert [f.key for f in faults] == [("cgroup", errno.EISDIR), ("cgroup", errno.ELOOP)]
    assert "pid 100" in str(faults[0]) and str(proc_root) in str(faults[0])


def test_missing_proc_root_is_one_fault_whatever_the_process(tmp_path):
    missing = str(tmp_path / "host" / "proc")
    faults = set()
    for pid in (100, 200):
        with pytest.raises(FileNotFoundError) as raised:
            process_stat(missing, pid)
        faults.add(fault_of(missing, pid, raised.value).key)
    assert faults == {("", errno.ENOENT)}
