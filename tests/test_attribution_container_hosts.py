"""Container hosts without Kubernetes: the dgx-h100 GPUs driven by Docker, Podman, nerdctl and
standalone containerd containers and two host processes, read from a real proc root whose cgroup
files are laid out as each runtime lays them out (the shapes tests/test_procfs.py takes from real
nodes)."""

import pytest
from datadog_checks.base.stubs import tagger

from gpu_monitoring.simulator.proc_root import build_proc_root

from .attribution_support import funnel, pod_tags, processes
from .conftest import tag_dict

DOCKER, PODMAN, NERDCTL, CONTAINERD = (c * 64 for c in "abcd")
# How each runtime names a container's cgroup (cgroup v2; the systemd driver where it has one).
LAYOUTS = {
    DOCKER: "0::/system.slice/docker-{}.scope",
    PODMAN: "0::/machine.slice/libpod-{}.scope/container",
    NERDCTL: "0::/system.slice/nerdctl-{}.scope",
    CONTAINERD: "0::/default/{}",
}
HOST_SESSION = "0::/user.slice/user-1000.slice/session-3.scope"
CONTAINERS = {41021: DOCKER, 41022: DOCKER, 52310: PODMAN, 60211: NERDCTL, 60388: NERDCTL, 71002: None,
              80417: CONTAINERD, 90114: None}
GPUS = {0: DOCKER, 1: DOCKER, 2: PODMAN, 3: NERDCTL, 6: CONTAINERD}
# Where 71002 and 90114, in a login session, run: 90114 holds GPU 7's memory and runs nothing.
HOST_GPUS = {4, 7}


@pytest.fixture
def container_host(node, tmp_path):
    root = build_proc_root(tmp_path / "proc", [{"pid": pid, "name": "python3"} for pid in CONTAINERS])
    for pid, container in CONTAINERS.items():
        line = LAYOUTS[container].format(container) if container else HOST_SESSION
        (root / str(pid) / "cgroup").write_text(line + "\n")
    dgx = node("dgx-h100", kubernetes=False, proc_root=str(root))
    yield dgx
    tagger.reset()


def _by_container(dgx, metric):
    return {(int(tag_dict(s.tags)["gpu_index"]), tag_dict(s.tags).get("container_id")): s.value
            for s in dgx.series(metric)}


def test_processes_and_workloads_carry_their_container(container_host):
    container_host.run(2)
    by_pid = processes(container_host, "process.memory.used")
    assert {pid: pod_tags(stub.tags) for pid, stub in by_pid.items()} == {
        pid: {"container_id": container} if container else {} for pid, container in CONTAINERS.items()
    }
    # The host's own processes are a workload too, one on each GPU they run on, without a container's
    # tags: those GPUs' hours are spent, idle (GPU 7) or not.
    assert _by_container(container_host, "workload.gpus") == {
        **{(index, cid): 1.0 for index, cid in GPUS.items()}, **{(index, None): 1.0 for index in HOST_GPUS}}
    assert _by_container(container_host, "workload.idle") == {
        **{(index, cid): 0.0 for index, cid in GPUS.items()}, (4, None): 0.0, (7, None): 1.0}
    # The host processes' GPUs run compute too.
    assert funnel(container_host)["allocated"] == len(GPUS) + len(HOST_GPUS)


def test_the_agent_taggers_tags_name_a_container_it_knows(container_host):
    tagger.set_tags({f"container_id://{DOCKER}": ["container_name:trainer", "image_name:pytorch"]})
    container_host.run(2)
    for pid in (41021, 41022):
        tags = processes(container_host, "process.memory.used")[pid].tags
        assert {"container_name:trainer", "image_name:pytorch"} <= set(tags)
    on_gpu_0 = [s.tags for s in container_host.series("workload.gpus") if "gpu_index:0" in s.tags]
    assert on_gpu_0 and all("container_name:trainer" in tags for tags in on_gpu_0)
