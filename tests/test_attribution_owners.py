"""Every process keeps its own owner (its own cgroup), whoever holds its GPU: the l4-mixed node, where
a GPU held by one pod also runs a host process and another pod's process."""

import pytest

from .attribution_support import MIB, container_id, funnel, pod_tags, processes, workloads
from .conftest import tag_dict

API, BATCH = "api-7f9c8d6b5-k2x9p", "batch-embeddings-0"
HOST_PID, API_PID, BATCH_ON_API_GPU, BATCH_PID = 7731, 4100, 5208, 5201


@pytest.fixture
def mixed(node):
    mixed = node("l4-mixed")
    mixed.run(2)
    return mixed


def test_each_process_carries_its_own_owner(mixed):
    by_pid = processes(mixed, "process.memory.used")
    assert set(by_pid) == {HOST_PID, API_PID, BATCH_ON_API_GPU, BATCH_PID}
    assert pod_tags(by_pid[HOST_PID].tags) == {}
    assert pod_tags(by_pid[API_PID].tags)["pod_name"] == API
    for pid in (BATCH_ON_API_GPU, BATCH_PID):
        assert pod_tags(by_pid[pid].tags) == {
            "pod_name": BATCH, "kube_namespace": "jobs", "kube_container_name": "worker",
            "container_id": container_id(mixed, BATCH),
        }
    # Each process is on the GPU NVML reports it on, whoever holds that GPU.
    assert tag_dict(by_pid[BATCH_ON_API_GPU].tags)["gpu_index"] == "0"
    assert by_pid[HOST_PID].value == 2300 * MIB


def test_a_gpu_whose_processes_have_several_owners_is_held_by_no_one_alone(mixed):
    on_gpu = {int(tag_dict(s.tags)["gpu_index"]): pod_tags(s.tags) for s in mixed.series("utilization.gpu")}
    assert on_gpu[0] == {}
    assert on_gpu[1]["pod_name"] == BATCH
    health = {index: pod_tags(stub.tags) for index, stub in mixed.health().items()}
    assert health == on_gpu


def test_workloads_count_what_each_pod_was_given_and_what_it_uses(mixed):
    assert workloads(mixed, "workload.gpus") == {(0, API): 1.0, (0, BATCH): 0.0, (1, BATCH): 1.0}
    assert workloads(mixed, "workload.memory.used") == {
        (0, API): 9800 * MIB, (0, BATCH): 1400 * MIB, (1, BATCH): 17600 * MIB,
    }
    # The host's process is no workload: no container holds or runs it.
    assert workloads(mixed, "workload.idle") == {(0, API): 0, (0, BATCH): 0, (1, BATCH): 0}
    assert funnel(mixed)["allocated"] == 2
