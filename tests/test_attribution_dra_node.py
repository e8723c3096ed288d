"""The `dra-h100` node end to end: NVIDIA's DRA driver allocates its GPUs, no device plugin runs, and
the check reads the claims from the simulated kubelet's pod-resources socket (gRPC, the real wire
format) and its pods from `/pods` (HTTPS with a token), as on a Kubernetes 1.34 node."""

import pytest

from .attribution_support import funnel, instance_workloads, kubelet_check, workloads
from .conftest import tag_dict

PRICE = 3.50  # the scenario's price of an H100 hour
MONITOR = "nvidia-dcgm-exporter-dra-8jx4c"


@pytest.fixture
def dra(node):
    return node("dra-h100").run(2)


def test_the_claimed_gpus_are_held_by_their_pods(dra):
    assert workloads(dra, "workload.gpus") == {
        (0, "llm-pretrain-0"): 1,
        (1, "llm-pretrain-0"): 1,
        (2, "vllm-llama-8b-7c9d5f6b4-m2xkq"): 1,
        # One claim, two pods: each has half.
        (4, "rag-embed-6d9c7b8f5-p4n2w"): 0.5,
        (4, "rag-rerank-5f8b9d7c6-k7t3v"): 0.5,
        # A claim with a share ID, and nobody else on the GPU.
        (5, "jupyter-carol"): 1,
        (7, "finetune-mistral-7b-0-zq5pl"): 1,
    }
    # The 1g.10gb MIG device of GPU 3 (GPU instance 13), named gpu-3-mig-1g10gb-19-6 by the driver.
    assert instance_workloads(dra, "workload.gpus") == {(3, 13, "jupyter-alice"): pytest.approx(1 / 7)}


def test_the_admin_access_monitor_owns_nothing(dra):
    pods = {tag_dict(s.tags).get("pod_name") for s in dra.series("workload.gpus")}
    assert MONITOR not in pods
    assert kubelet_check().status == dra.check.OK


def test_the_funnel_counts_every_gpu_nvml_sees_as_allocatable(dra):
    allocatable = {tag_dict(s.tags)["gpu_device"]: s.value for s in dra.series("fleet.devices.allocatable")}
    assert allocatable == {"nvidia_h100_80gb_hbm3": 8}
    # GPU 6 and GPU 3's unclaimed 3g.40gb instance are held by nobody; GPU 3 counts as allocated by its MIG device.
    assert funnel(dra)["total"] == 8 and funnel(dra)["allocated"] == 7


def test_idle_cost_falls_on_the_unclaimed_gpu_and_slices_only(dra):
    idle = {index: value for index, value in dra.values("cost.idle_hourly").items() if value}
    # GPU 3 is MIG: jupyter-alice holds one slice of seven, the other six are nobody's.
    assert idle == {6: PRICE, 3: pytest.approx(PRICE * 6 / 7)}
    charged = {tag_dict(s.tags)["pod_name"]: s.value for s in dra.series("workload.cost.hourly")}
    assert charged["llm-pretrain-0"] == pytest.approx(PRICE)  # per GPU series: two of them
    assert charged["jupyter-alice"] == pytest.approx(PRICE / 7)


def test_workload_series_name_their_claim(dra):
    claims = {(tag_dict(s.tags)["pod_name"], tag_dict(s.tags).get("dra_claim_name"), tag_dict(s.tags).get(
        "dra_claim_namespace")) for s in dra.series("workload.gpus")}
    assert ("rag-rerank-5f8b9d7c6-k7t3v", "rag-shared-gpu", "inference") in claims
    assert ("jupyter-alice", "jupyter-alice-mig-4hq8d", "research") in claims
    assert all(claim and namespace for _, claim, namespace in claims)


def test_no_gpu_is_said_to_be_refused_by_kubernetes(dra):
    # GetAllocatableResources lists no DRA device: that is not the device plugins refusing the GPUs.
    assert {index: (stub.status, stub.message) for index, stub in dra.health().items()} == {
        index: (dra.check.OK, "") for index in range(8)}
