"""Exclusive GPUs on Kubernetes (scenario dgx-h100): six pods hold seven of eight H100s.

The funnel, each pod's workload, pod tags on the GPUs one container holds, process tags, the
Agent tagger's tags, and what the GPUs and their idle time cost. The eighth GPU was given to no pod,
yet the process of a pod that failed still holds memory on it.
"""

from pathlib import Path

import pytest
from datadog_checks.base import AgentCheck
from datadog_checks.base.stubs import tagger

from gpu_monitoring.kube.pod_list import TERMINAL_PHASES

from .attribution_support import (
    MIB,
    container_id,
    funnel,
    kubelet_check,
    pod_tags,
    processes,
    workloads,
)
from .conftest import tag_dict

H100_PRICE = {"NVIDIA H100*": 4.0}
# gpu index: (pod, namespace, container, pids on the GPU)
HELD = {
    0: ("llm-pretrain-0", "ml-training", "trainer", [41021]),
    1: ("llm-pretrain-0", "ml-training", "trainer", [41022]),
    2: ("vllm-llama-70b-5d8f7c9b6-x2kqp", "inference", "vllm", [52310]),
    3: ("triton-resnet-6c9f8d7b5-q8wzt", "inference", "triton", [60211, 60388]),
    4: ("jupyter-alice", "research", "notebook", [71002]),
    5: ("jupyter-bob", "research", "notebook", []),
    6: ("finetune-mistral-7b-0", "ml-training", "trainer", [80417]),
}
FREE = 7
IDLE_HOLDER = 5
PROCESS_NAMES = {41021: "python3", 41022: "python3", 52310: "vllm-engine", 60211: "triton-server", 60388: "python3",
                 71002: "jupyter-kernel", 80417: "torchrun", 90114: "python3"}
WORKLOAD_MEMORY_MIB = {0: 71200, 1: 71100, 2: 40120, 3: 15000 + 7500, 4: 12800, 5: 0, 6: 54400}


@pytest.fixture
def dgx(node):
    """dgx-h100 with H100 prices, after two runs (GPM has its previous sample on the second)."""
    return node("dgx-h100", hourly_price=H100_PRICE).run(2)


@pytest.fixture
def known_to_the_tagger():
    yield tagger
    tagger.reset()


def expected_pod_tags(node, index):
    pod, namespace, container, _ = HELD[index]
    return {
        "pod_name": pod,
        "kube_namespace": namespace,
        "kube_container_name": container,
        "container_id": container_id(node, pod),
    }


def test_the_fleet_funnel(dgx):
    sm_active = dgx.values("sm_active")
    assert set(sm_active) == set(range(8))
    busy = {index for index, (_, _, _, pids) in HELD.items() if pids}
    # Effective: active GPUs whose SM activity (GPM) reached the default threshold of 50 %.
    effective = {index for index in busy if sm_active[index] >= 50}
    assert effective == {0, 1, 2, 6}, sm_active
    assert funnel(dgx) == {"total": 8, "allocated": 7, "active": 6, "effective": len(effective)}
    assert [s.value for s in dgx.series("devices.count")] == [8]
    for stage in ("total", "allocated", "active", "effective"):
        (stub,) = dgx.series(f"fleet.devices.{stage}")
        assert stub.tags == ["gpu_device:nvidia_h100_80gb_hbm3", "activity_source:gpm"]
    kubelet = kubelet_check()
    assert kubelet.status == AgentCheck.OK and not kubelet.message


@pytest.mark.parametrize("threshold", [20, 30, 90])
def test_effective_threshold_moves_the_effective_count(node, threshold):
    dgx = node("dgx-h100", effective_threshold=threshold).run(2)
    sm_active = dgx.values("sm_active")
    effective = sum(1 for index, held in HELD.items() if held[3] and sm_active[index] >= threshold)
    assert funnel(dgx) == {"total": 8, "allocated": 7, "active": 6, "effective": effective}
    # The scenario's loads put the thresholds on either side of some GPUs.
    assert effective == {20: 6, 30: 5, 90: 0}[threshold], sm_active


def test_one_workload_per_held_gpu(dgx):
    gpus = workloads(dgx, "workload.gpus")
    assert gpus == {(index, held[0]): 1 for index, held in HELD.items()}
    idle = workloads(dgx, "workload.idle")
    assert idle == {(index, held[0]): int(index == IDLE_HOLDER) for index, held in HELD.items()}
    memory = workloads(dgx, "workload.memory.used")
    assert memory == {(index, held[0]): WORKLOAD_MEMORY_MIB[index] * MIB for index, held in HELD.items()}
    sm = workloads(dgx, "workload.sm_utilization")
    process_sm = {pid: stub.value for pid, stub in processes(dgx, "process.sm_utilization").items()}
    for index, (pod, _, _, pids) in HELD.items():
        # A container's SM use is the sum of its processes' on the GPU.
        assert sm[(index, pod)] == sum(process_sm[pid] for pid in pids)
        assert (sm[(index, pod)] > 0) == bool(pids)
    # No MPS on these GPUs: no SM limit.
    assert dgx.series("workload.sm_limit") == []


def test_the_held_but_idle_gpu(dgx):
    # GPU 5 is held by jupyter-bob, which runs nothing on it.
    assert dgx.values("utilization.gpu")[IDLE_HOLDER] == 0
    assert dgx.values("processes.count")[IDLE_HOLDER] == 0
    assert workloads(dgx, "workload.idle")[(IDLE_HOLDER, "jupyter-bob")] == 1
    assert workloads(dgx, "workload.sm_utilization")[(IDLE_HOLDER, "jupyter-bob")] == 0
    assert dgx.values("cost.idle_hourly")[IDLE_HOLDER] == 4.0


def finished_container(node):
    """The one pod of the scenario that is over, and its one container."""
    (pod,) = [pod for pod in node.check.simulated_node.pods if pod["phase"] in TERMINAL_PHASES]
    (container,) = pod["containers"]
    return pod, container


def test_the_free_gpu_has_no_workload_and_no_pod(dgx, aggregator):
    # A finished pod holds nothing: its process left on the free GPU makes no workload, and the GPU's
    # own series name no pod. The process's own series name its owner, from its own cgroup.
    pod, container = finished_container(dgx)
    owner = {"pod_name": pod["name"], "kube_namespace": pod["namespace"], "kube_container_name": container["name"],
             "container_id": container["container_id"]}
    its_processes = set()
    for name in aggregator.metric_names:
        for stub in aggregator.metrics(name):
            tags = tag_dict(stub.tags)
            if tags.get("gpu_index") != str(FREE):
                continue
            assert not name.startswith("gpu_monitoring.workload."), (name, stub.tags)
            if name.startswith("gpu_monitoring.process."):
                its_processes.add(int(tags["pid"]))
                assert pod_tags(stub.tags) == owner, (name, stub.tags)
            else:
                assert pod_tags(stub.tags) == {}, (name, stub.tags)
    assert its_processes == set(container["processes"])
    (health,) = [s for s in aggregator.service_checks("gpu_monitoring.device.health")
                 if tag_dict(s.tags)["gpu_index"] == str(FREE)]
    assert pod_tags(health.tags) == {}
    # Memory nobody holds the GPU to free: a WARNING that names the process and its pod.
    assert health.status == AgentCheck.WARNING
    for pid in container["processes"]:
        assert f"pid {pid} (pod {pod['namespace']}/{pod['name']} is {pod['phase']})" in health.message


def test_device_metrics_of_exclusive_gpus_carry_their_pod(dgx, aggregator):
    for index in HELD:
        expected = expected_pod_tags(dgx, index)
        for metric in ("utilization.gpu", "memory.used", "temperature", "sm_active", "energy.consumed", "cost.hourly"):
            (stub,) = [s for s in dgx.series(metric) if tag_dict(s.tags)["gpu_index"] == str(index)]
            assert pod_tags(stub.tags) == expected, (metric, stub.tags)
        (health,) = [s for s in aggregator.service_checks("gpu_monitoring.device.health")
                     if tag_dict(s.tags)["gpu_index"] == str(index)]
        assert pod_tags(health.tags) == expected
    # The pretraining pod's one container holds two GPUs: the same container on both.
    assert container_id(dgx, "llm-pretrain-0") == expected_pod_tags(dgx, 0)["container_id"]


def test_workload_metrics_carry_device_and_pod_tags(dgx):
    for stub in dgx.series("workload.gpus"):
        tags = tag_dict(stub.tags)
        index = int(tags["gpu_index"])
        assert pod_tags(stub.tags) == expected_pod_tags(dgx, index)
        assert (tags["gpu_slicing_mode"], tags["gpu_sharing_mode"]) == ("none", "none")
        assert tags["gpu_uuid"].startswith("gpu-")


def test_process_metrics_carry_pid_name_and_pod(dgx):
    memory = processes(dgx, "process.memory.used")
    assert set(memory) == set(PROCESS_NAMES)
    for index, (_, _, _, pids) in HELD.items():
        for pid in pids:
            tags = tag_dict(memory[pid].tags)
            assert tags["gpu_index"] == str(index)
            assert tags["process_name"] == PROCESS_NAMES[pid]
            assert pod_tags(memory[pid].tags) == expected_pod_tags(dgx, index)
    assert memory[60211].value == 15000 * MIB and memory[60388].value == 7500 * MIB
    # The failed pod's process on the free GPU: named, holding memory, running nothing.
    (left_behind,) = set(PROCESS_NAMES) - {pid for *_, pids in HELD.values() for pid in pids}
    assert tag_dict(memory[left_behind].tags)["gpu_index"] == str(FREE)
    assert tag_dict(memory[left_behind].tags)["process_name"] == PROCESS_NAMES[left_behind]
    assert memory[left_behind].value == 6144 * MIB
    sm = processes(dgx, "process.sm_utilization")
    assert set(sm) == set(PROCESS_NAMES)
    assert all(0 < stub.value <= 100 for pid, stub in sm.items() if pid != left_behind)
    assert sm[left_behind].value == 0


def test_process_name_is_read_from_the_proc_root(node):
    dgx = node("dgx-h100")
    # NVML names no process: the name is the one its `stat` gives when the check first sees it.
    stat = Path(dgx.check.derived.proc_root) / "52310" / "stat"
    stat.write_text(stat.read_text().replace("(vllm-engine)", "(vllm-renamed)"))
    dgx.run()
    stub = processes(dgx, "process.memory.used")[52310]
    assert tag_dict(stub.tags)["process_name"] == "vllm-renamed"


def test_costs(dgx):
    assert dgx.values("cost.hourly") == dict.fromkeys(range(8), 4.0)
    assert dgx.values("cost.idle_hourly") == {i: 4.0 if i in (IDLE_HOLDER, FREE) else 0.0 for i in range(8)}
    assert workloads(dgx, "workload.cost.hourly") == {(index, held[0]): 4.0 for index, held in HELD.items()}
    assert workloads(dgx, "workload.cost.idle_hourly") == {
        (index, held[0]): 4.0 if index == IDLE_HOLDER else 0.0 for index, held in HELD.items()
    }


def test_no_price_no_cost_metrics(node):
    # An instance's hourly_price replaces the scenario's prices: none at all here.
    dgx = node("dgx-h100", hourly_price={}).run()
    for metric in ("cost.hourly", "cost.idle_hourly", "workload.cost.hourly", "workload.cost.idle_hourly"):
        assert dgx.series(metric) == [], metric


@pytest.mark.parametrize(
    "options, price",
    [
        ({"hourly_price": {"NVIDIA H100*": 4.0, "NVIDIA H100 80GB HBM3": 5.5}}, 5.5),  # the exact name wins
        ({"hourly_price": {"NVIDIA A100*": 3.0}, "default_hourly_price": 2.5}, 2.5),  # no model matches
        ({"hourly_price": {}, "default_hourly_price": 1.25}, 1.25),
    ],
)
def test_price_lookup(node, options, price):
    dgx = node("dgx-h100", **options).run()
    assert dgx.values("cost.hourly") == dict.fromkeys(range(8), price)
    assert workloads(dgx, "workload.cost.idle_hourly")[(IDLE_HOLDER, "jupyter-bob")] == price


def test_the_agent_taggers_tags_replace_pod_names(node, known_to_the_tagger):
    dgx = node("dgx-h100")
    alice = container_id(dgx, "jupyter-alice")
    known_to_the_tagger.set_tags(
        {f"container_id://{alice}": ["team:research", "app:notebook", f"container_id:{alice}"]}
    )
    dgx.run()
    by_gpu = {int(tag_dict(s.tags)["gpu_index"]): s for s in dgx.series("utilization.gpu")}
    # GPU 4 (jupyter-alice): the tagger's tags, which carry the user's pod-label tags, not our own names.
    assert {"team:research", "app:notebook", f"container_id:{alice}"} <= set(by_gpu[4].tags)
    assert pod_tags(by_gpu[4].tags) == {"container_id": alice}
    (workload,) = [s for s in dgx.series("workload.gpus") if tag_dict(s.tags)["gpu_index"] == "4"]
    assert {"team:research", "app:notebook"} <= set(workload.tags)
    assert workload.value == 1
    process = processes(dgx, "process.memory.used")[71002]
    assert {"team:research", "app:notebook", "pid:71002", "process_name:jupyter-kernel"} <= set(process.tags)
    assert "pod_name:jupyter-alice" not in process.tags
    # The tagger does not know the other containers: they keep the names from the kubelet.
    assert pod_tags(by_gpu[2].tags)["pod_name"] == "vllm-llama-70b-5d8f7c9b6-x2kqp"
    assert "team:research" not in by_gpu[2].tags
    known_to_the_tagger.assert_called(f"container_id://{alice}", known_to_the_tagger.ORCHESTRATOR)

