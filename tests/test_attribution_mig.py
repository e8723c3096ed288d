"""MIG on Kubernetes (scenario a100-mig): pods hold MIG instances through nvidia.com/mig-* resources.

Each held instance is a workload worth its slices out of seven; the legacy ID form resolves; a free
instance has no workload; the instance's own series carry the pod that holds it, the MIG parent none.
"""

import pytest

from .attribution_support import container_id, funnel, instance_workloads, pod_tags, workloads
from .conftest import tag_dict

A100_PRICE = 3.0
# (gpu, gpu instance id): (pod, namespace, container, profile, idle)
INSTANCES = {
    (0, 2): ("train-large", "ml", "trainer", "3g.40gb", False),
    (0, 3): ("train-small", "ml", "trainer", "2g.20gb", False),
    (0, 9): ("notebook-carol", "research", "notebook", "1g.10gb", False),
    (1, 7): ("triton-0", "inference", "triton", "1g.10gb", False),
    (1, 8): ("triton-1", "inference", "triton", "1g.10gb", False),
    (1, 9): ("triton-2", "inference", "triton", "1g.10gb", False),
    (1, 10): ("triton-3", "inference", "triton", "1g.10gb", False),
    (1, 11): ("triton-4", "inference", "triton", "1g.10gb", True),
    (1, 13): ("batch-embed", "ml", "embed", "1g.10gb", False),  # listed by its legacy ID MIG-GPU-<uuid>/13/0
    (3, 0): ("whole-gpu-job", "ml", "job", "7g.80gb", False),
}
FREE_INSTANCES = [(0, 10), (1, 12)]
SLICES = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3, "7g.80gb": 7}


@pytest.fixture
def a100(node):
    # NVML alone (no DCGM activity): the funnel as processes and utilization tell it.
    return node("a100-mig", hourly_price={"NVIDIA A100-SXM4-80GB": A100_PRICE}, dcgm_exporter_url="none").run(2)


def test_workloads_per_instance(a100):
    resources = {a.resource_name for a in a100.check.simulated_node.allocations()}
    assert resources == {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb",
                         "nvidia.com/mig-3g.40gb", "nvidia.com/mig-7g.80gb"}
    gpus = instance_workloads(a100, "workload.gpus")
    assert gpus == pytest.approx({(gpu, gi, held[0]): SLICES[held[3]] / 7 for (gpu, gi), held in INSTANCES.items()})
    assert gpus[(0, 2, "train-large")] == pytest.approx(3 / 7)
    assert gpus[(0, 9, "notebook-carol")] == pytest.approx(1 / 7)
    assert gpus[(3, 0, "whole-gpu-job")] == 1
    # GPU 0: 3 + 2 + 1 slices held, one 1g instance free; GPU 1: six of seven 1g instances held.
    per_gpu = {gpu: sum(v for (g, _, _), v in gpus.items() if g == gpu) for gpu in (0, 1, 3)}
    assert per_gpu == pytest.approx({0: 6 / 7, 1: 6 / 7, 3: 1})
    # GPU 2 has MIG off and is held whole by torch-ddp-0.
    assert workloads(a100, "workload.gpus") == {(2, "torch-ddp-0"): 1}
    idle = instance_workloads(a100, "workload.idle")
    assert idle == {(gpu, gi, held[0]): int(held[4]) for (gpu, gi), held in INSTANCES.items()}


def test_workload_tags_name_the_instance_and_the_pod(a100):
    for stub in a100.series("workload.gpus"):
        tags = tag_dict(stub.tags)
        if "gpu_instance_id" not in tags:
            continue
        pod, namespace, container, profile, _ = INSTANCES[(int(tags["gpu_index"]), int(tags["gpu_instance_id"]))]
        assert tags["gpu_mig_profile"] == profile
        assert tags["gpu_slicing_mode"] == "mig"
        assert tags["gpu_uuid"].startswith("mig-") and tags["gpu_parent_uuid"].startswith("gpu-")
        assert pod_tags(stub.tags) == {
            "pod_name": pod,
            "kube_namespace": namespace,
            "kube_container_name": container,
            "container_id": container_id(a100, pod),
        }


def test_the_legacy_mig_id_resolves(a100):
    allocations = a100.check.simulated_node.allocations()
    (legacy,) = [a for a in allocations if a.pod == "batch-embed"]
    parent_uuid = a100.sim.devices[1].spec.uuid
    assert legacy.device_id == f"MIG-{parent_uuid}/13/0"
    assert legacy.resource_name == "nvidia.com/mig-1g.10gb"
    (stub,) = [s for s in a100.series("workload.gpus") if pod_tags(s.tags).get("pod_name") == "batch-embed"]
    tags = tag_dict(stub.tags)
    assert (tags["gpu_index"], tags["gpu_instance_id"], tags["gpu_parent_uuid"]) == ("1", "13", parent_uuid.lower())
    assert a100.check.warnings == []


def test_free_instances_have_no_workload_and_no_pod(a100, aggregator):
    held = {(gpu, gi) for gpu, gi, _ in instance_workloads(a100, "workload.gpus")}
    assert held == set(INSTANCES)
    for name in aggregator.metric_names:
        for stub in aggregator.metrics(name):
            tags = tag_dict(stub.tags)
            if "gpu_instance_id" in tags and (int(tags["gpu_index"]), int(tags["gpu_instance_id"])) in FREE_INSTANCES:
                assert not name.startswith("gpu_monitoring.workload."), (name, stub.tags)
                assert pod_tags(stub.tags) == {}, (name, stub.tags)


def test_held_instances_carry_their_pod_and_parents_none(a100):
    memory = a100.instance_values("memory.used")
    assert set(memory) == set(INSTANCES) | set(FREE_INSTANCES)
    for stub in a100.series("memory.used"):
        tags = tag_dict(stub.tags)
        if "gpu_instance_id" in tags:
            key = (int(tags["gpu_index"]), int(tags["gpu_instance_id"]))
            expected = INSTANCES[key][0] if key in INSTANCES else None
            assert pod_tags(stub.tags).get("pod_name") == expected, stub.tags
        elif tags["gpu_slicing_mode"] == "mig-parent":
            # Several pods share a MIG parent: its own series name none of them.
            assert pod_tags(stub.tags) == {}, stub.tags
        else:
            assert tags["gpu_index"] == "2"
            assert pod_tags(stub.tags)["pod_name"] == "torch-ddp-0"
    # Process series on an instance carry the instance's pod too.
    for stub in a100.series("process.memory.used"):
        tags = tag_dict(stub.tags)
        if "gpu_instance_id" in tags:
            assert tags["pod_name"] == INSTANCES[(int(tags["gpu_index"]), int(tags["gpu_instance_id"]))][0]


def test_costs(a100):
    assert a100.values("cost.hourly") == dict.fromkeys(range(4), A100_PRICE)
    # A MIG GPU's idle cost is its free slices' and its idle holders' (triton-4 on GPU 1), by their slices.
    idle_slices = dict.fromkeys(range(4), 0)
    for gpu, _ in FREE_INSTANCES:
        idle_slices[gpu] += 1
    for (gpu, _), held in INSTANCES.items():
        idle_slices[gpu] += SLICES[held[3]] if held[4] else 0
    assert a100.values("cost.idle_hourly") == pytest.approx({gpu: A100_PRICE * n / 7 for gpu, n in idle_slices.items()})
    cost = instance_workloads(a100, "workload.cost.hourly")
    assert cost == pytest.approx(
        {(gpu, gi, held[0]): A100_PRICE * SLICES[held[3]] / 7 for (gpu, gi), held in INSTANCES.items()})
    idle_cost = instance_workloads(a100, "workload.cost.idle_hourly")
    assert idle_cost == pytest.approx(
        {(gpu, gi, held[0]): A100_PRICE / 7 if held[4] else 0.0 for (gpu, gi), held in INSTANCES.items()})


def test_funnel(a100):
    # A100 has no GPM and MIG parents report no utilization.gpu: only GPU 2 (MIG off) has an
    # activity level to hold against the threshold.
    assert set(a100.values("utilization.gpu")) == {2}
    assert a100.series("sm_active") == []
    effective = int(a100.values("utilization.gpu")[2] >= 50)
    assert funnel(a100) == {"total": 4, "allocated": 4, "active": 4, "effective": effective}
    assert effective == 1


def test_every_mig_workload_is_as_busy_as_its_slice(node):
    """NVML samples no process in MIG mode (nvmlDeviceGetProcessUtilization): a workload alone on a slice
    is as busy as the slice's SM activity, which DCGM measures per GPU instance on an A100."""
    a100 = node("a100-mig").run(2)
    activity = {(t["gpu_index"], t["gpu_instance_id"]): stub.value
                for stub in a100.series("sm_active") for t in [tag_dict(stub.tags)] if "gpu_instance_id" in t}
    busy = {(t["gpu_index"], t["gpu_instance_id"]): stub.value
            for stub in a100.series("workload.sm_utilization") for t in [tag_dict(stub.tags)]
            if "gpu_instance_id" in t}
    held = {(str(gpu), str(instance)) for (gpu, instance) in INSTANCES}
    assert held <= set(busy), sorted(held - set(busy))
    assert all(busy[key] == pytest.approx(activity[key]) for key in held)
    # The slice a pod holds idle is measured idle, not unknown.
    assert busy[("1", "11")] == 0
