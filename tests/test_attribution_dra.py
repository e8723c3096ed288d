"""GPUs allocated through DRA claims (driver gpu.nvidia.com), on the simulator's nodes.

The snapshot is the simulated node's own, read through NVML; its pod-resources answer is replaced by
the DRA allocations a node running NVIDIA's DRA driver would list for the same pods: `gpu-<minor>`
for a whole GPU, `gpu-<minor>-mig-<profile>-<GI profile id>-<start>` (or, from older drivers,
`gpu-<minor>-mig-<GI profile id>-<start>-<size>`) for a MIG device. GetAllocatableResources lists
no DRA device, so the device plugins advertise nothing.
"""

import dataclasses

import pytest

from gpu_monitoring.attribution.pipeline import attribute
from gpu_monitoring.health.device_health import Health
from gpu_monitoring.kube.dra_names import DraDeviceRef, parse_dra_name
from gpu_monitoring.kube.pod_list import ContainerInfo, PodInfo
from gpu_monitoring.snapshot import Allocation, Allocations

from .conftest import H100_PCIE_NODE, tag_dict

DRIVER = "gpu.nvidia.com"
H100_PRICE = 4.0
MONITOR = ("gpu-operator", "nvidia-dcgm-exporter-dra-7xk2p")
IDLE_GPU = 7  # dgx-h100: no pod holds GPU 7; a failed pod's process is left on it


class DraNode:
    """A simulated node whose pod-resources lists DRA claims instead of device-plugin IDs."""

    def __init__(self, simulated):
        self.sim = simulated.run()
        self.snapshot = self.sim.check.source.read()
        self.devices = {d.index: d for d in self.snapshot.devices}
        self.pods = self._pods()

    def _pods(self):
        """The pods as the kubelet lists them: each in its scenario's phase (a failed pod's process is no workload)."""
        return {
            (pod["namespace"], pod["name"]): PodInfo(
                uid=pod["uid"],
                name=pod["name"],
                namespace=pod["namespace"],
                phase=pod["phase"],
                containers=[ContainerInfo(c["name"], c["container_id"], env=c.get("env", {}))
                            for c in pod["containers"]],
            )
            for pod in self.sim.check.simulated_node.pods
        }

    def gpu(self, index):
        """The DRA device name of a whole GPU: its NVML minor number."""
        return f"gpu-{self.devices[index].minor_number}"

    def whole_gpu_claims(self):
        """One claim per pod for the GPUs the simulated device plugin gave it, named `<pod>-gpus`."""
        by_uuid = {d.uuid: d.index for d in self.snapshot.devices}
        return [claim(a.namespace, a.pod, a.container, self.gpu(by_uuid[a.device_id]))
                for a in self.sim.check.simulated_node.allocations()]

    def add_pod(self, namespace, name, controller_kind=None):
        self.pods[(namespace, name)] = PodInfo(
            uid=f"uid-{name}", name=name, namespace=namespace, phase="Running",
            containers=[ContainerInfo("main", f"cid-{name}")], controller_kind=controller_kind,
        )

    def monitor_claims(self, controller_kind="DaemonSet"):
        """dcgm-exporter in DRA mode: one admin-access claim over every GPU."""
        self.add_pod(*MONITOR, controller_kind=controller_kind)
        return [claim(*MONITOR, "main", self.gpu(i), name="dcgm-exporter-admin") for i in self.devices]

    def attribute(self, allocations, default_hourly_price=None):
        snapshot = dataclasses.replace(
            self.snapshot, allocations=Allocations(source="pod_resources", items=allocations, advertised=[])
        )
        return attribute(snapshot, list(self.pods.values()), 50.0, lambda _model: default_hourly_price)

    def submit(self, aggregator, attribution):
        """The workload series the check submits for an attribution."""
        aggregator.reset()
        healths = {i: Health() for i in self.devices}
        self.sim.check.submitter.submit(self.snapshot, healths, attribution, self.sim.check.judge.node(self.snapshot))
        return [dict(tag_dict(stub.tags), value=stub.value) for stub in self.sim.series("workload.cost.hourly")]


def claim(namespace, pod, container, device, name=None, share_id=None):
    return Allocation(namespace=namespace, pod=pod, container=container, resource_name=DRIVER, device_id=device,
                      claim_name=name or f"{pod}-gpus", claim_namespace=namespace, pool="node-1", share_id=share_id)


def shares(attribution):
    return {(w.target, w.holder.pod): w.gpus for w in attribution.workloads}


def whole(attribution):
    """{(gpu index, pod): workload.gpus} on whole GPUs, of the pods that hold some (not those that only run there)."""
    return {(key[0], pod): gpus for (key, pod), gpus in shares(attribution).items() if key[1] is None and gpus}


def funnel(attribution):
    """The node's funnel, summed over GPU models and activity bases."""
    total = {}
    for row in attribution.funnel.values():
        for stage, count in row.items():
            total[stage] = total.get(stage, 0) + count
    return total


@pytest.fixture
def dgx(node):
    return DraNode(node("dgx-h100", dcgm_exporter_url="none"))


@pytest.fixture
def a100(node):
    return DraNode(node("a100-mig", dcgm_exporter_url="none"))


def test_whole_gpu_claims_are_owned_allocated_and_charged(dgx, aggregator):
    found = dgx.attribute(dgx.whole_gpu_claims(), default_hourly_price=H100_PRICE)
    assert found.problems == []
    assert whole(found) == {
        (0, "llm-pretrain-0"): 1, (1, "llm-pretrain-0"): 1, (2, "vllm-llama-70b-5d8f7c9b6-x2kqp"): 1,
        (3, "triton-resnet-6c9f8d7b5-q8wzt"): 1, (4, "jupyter-alice"): 1, (5, "jupyter-bob"): 1,
        (6, "finetune-mistral-7b-0"): 1,
    }
    assert {i for i, view in found.devices.items() if view.state.allocated} == set(range(7))
    # Each GPU's series carry the pod that holds it alone; each process its own pod by its cgroup.
    assert {i: view.holders[(i, None)].pod for i, view in found.devices.items() if view.holders} == \
        {i: pod for (i, pod) in whole(found)}
    assert {pid: h.pod for (_, pid), h in found.process_holders.items()}[52310] == "vllm-llama-70b-5d8f7c9b6-x2kqp"
    assert {view.sharing_mode((i, None)) for i, view in found.devices.items()} == {"none"}
    charged = {(int(s["gpu_index"]), s["pod_name"]): s["value"] for s in dgx.submit(aggregator, found)}
    assert charged == {key: H100_PRICE for key in whole(found)}


def test_the_idle_gpu_is_not_allocated_nor_charged_to_anyone(dgx, aggregator):
    found = dgx.attribute(dgx.whole_gpu_claims(), default_hourly_price=H100_PRICE)
    assert not found.devices[IDLE_GPU].state.allocated
    assert IDLE_GPU not in {key[0] for key, _ in shares(found)}
    assert found.devices[IDLE_GPU].price == H100_PRICE
    assert funnel(found)["allocated"] == 7
    # The process a failed pod left on it makes nobody its holder: it is a zombie, holding its memory.
    assert not found.devices[IDLE_GPU].holders
    assert [zombie.pid for zombie in found.devices[IDLE_GPU].zombies] == [90114]


def test_workload_series_carry_their_claim(dgx, aggregator):
    series = dgx.submit(aggregator, dgx.attribute(dgx.whole_gpu_claims(), default_hourly_price=H100_PRICE))
    assert {(s["pod_name"], s["dra_claim_name"], s["dra_claim_namespace"]) for s in series} == {
        ("llm-pretrain-0", "llm-pretrain-0-gpus", "ml-training"),
        ("vllm-llama-70b-5d8f7c9b6-x2kqp", "vllm-llama-70b-5d8f7c9b6-x2kqp-gpus", "inference"),
        ("triton-resnet-6c9f8d7b5-q8wzt", "triton-resnet-6c9f8d7b5-q8wzt-gpus", "inference"),
        ("jupyter-alice", "jupyter-alice-gpus", "research"),
        ("jupyter-bob", "jupyter-bob-gpus", "research"),
        ("finetune-mistral-7b-0", "finetune-mistral-7b-0-gpus", "ml-training"),
    }


def test_device_plugin_workloads_carry_no_claim_tags(node, aggregator):
    node("dgx-h100", dcgm_exporter_url="none").run()
    assert not any(key.startswith("dra_claim") for stub in aggregator.metrics("gpu_monitoring.workload.gpus")
                   for key in tag_dict(stub.tags))


def test_allocatable_counts_the_gpus_that_are_not_lost(node, tmp_path):
    scenario = tmp_path / "dra-lost.yaml"
    gpus = "".join("\n  - {model: h100, load: {utilization: 50}}" for _ in range(4))
    scenario.write_text(H100_PCIE_NODE + f"""
description: Four H100 PCIe on a DRA node, one of them lost.
devices:{gpus}
faults:
  - {{at: 0, kind: gpu_lost, device: 2}}
""")
    dra = DraNode(node(scenario))
    found = dra.attribute([claim("ml", "job", "main", dra.gpu(0))])
    row = funnel(found)
    assert (row["total"], row["allocatable"], row["allocated"]) == (4, 3, 1)
    # No device plugin offers a DRA node's GPUs: that is no reason to call them unhealthy.
    assert {view.offered for view in found.devices.values()} == {None}


def test_mig_devices_by_both_naming_schemes(a100):
    minor = {i: d.minor_number for i, d in a100.devices.items()}
    found = a100.attribute([
        claim("ml", "train-large", "trainer", f"gpu-{minor[0]}-mig-3g40gb-9-4"),
        claim("ml", "whole-gpu-job", "job", f"gpu-{minor[3]}-mig-0-0-8"),  # the older scheme
    ])
    assert found.problems == []
    gi = {m.uuid: m.gpu_instance_id for d in a100.devices.values() for m in d.mig_instances}
    instances = {(key[0], gi[key[1]], pod): gpus for (key, pod), gpus in shares(found).items() if key[1]}
    assert instances[(0, 2, "train-large")] == pytest.approx(3 / 7)
    assert instances[(3, 0, "whole-gpu-job")] == 1
    # The other pods run on instances no claim names: on Kubernetes they hold none of them.
    assert instances[(0, 3, "train-small")] == 0
    assert {i for i, view in found.devices.items() if view.state.allocated} == {0, 3}


def test_a_mig_name_picks_its_instance_by_placement_among_several_of_one_profile(a100):
    minor = {i: d.minor_number for i, d in a100.devices.items()}
    found = a100.attribute([claim("research", "notebook-carol", "notebook", f"gpu-{minor[1]}-mig-1g10gb-19-3"),
                            claim("ml", "train-small", "trainer", f"gpu-{minor[0]}-mig-19-2-1")])
    assert found.problems == []
    gi = {m.uuid: m.gpu_instance_id for d in a100.devices.values() for m in d.mig_instances}
    held = {(key[0], gi[key[1]], pod) for (key, pod), gpus in shares(found).items() if key[1] and gpus}
    # a100-mig's GPU 1 has seven 1g.10gb instances, GI 7-13 at slices 0-6; GPU 0 two, GI 9 and 10 at 2 and 3.
    assert held == {(1, 10, "notebook-carol"), (0, 9, "train-small")}


def test_a_mig_name_where_no_instance_is_placed_is_reported(a100):
    minor0 = a100.devices[0].minor_number
    found = a100.attribute([claim("research", "notebook-carol", "notebook", f"gpu-{minor0}-mig-1g10gb-19-6")])
    assert found.problems == [
        "research/notebook-carol/notebook (claim research/notebook-carol-gpus): device "
        f"gpu-{minor0}-mig-1g10gb-19-6 names GI profile 19 at slice 6 of GPU 0, where no MIG instance is"
    ]
    assert not any(view.state.allocated for view in found.devices.values())


def test_a_mig_name_on_a_gpu_whose_placements_nvml_did_not_tell_is_reported(a100):
    for instance in a100.devices[1].mig_instances:
        instance.gpu_instance_profile_id = instance.placement_start = instance.placement_size = None
    minor1 = a100.devices[1].minor_number
    found = a100.attribute([claim("research", "notebook-carol", "notebook", f"gpu-{minor1}-mig-1g10gb-19-3")])
    (problem,) = found.problems
    assert "NVML did not tell the placement of 7 MIG instance(s) of GPU 1" in problem


def test_two_claims_on_one_gpu_share_it(dgx):
    claims = [claim("inference", "vllm-llama-70b-5d8f7c9b6-x2kqp", "vllm", dgx.gpu(2)),
              claim("inference", "triton-resnet-6c9f8d7b5-q8wzt", "triton", dgx.gpu(2))]
    found = dgx.attribute(claims)
    assert whole(found) == {(2, "vllm-llama-70b-5d8f7c9b6-x2kqp"): 0.5, (2, "triton-resnet-6c9f8d7b5-q8wzt"): 0.5}
    assert found.devices[2].sharing_mode((2, None)) == "time_slicing"
    assert found.devices[2].holders == {}  # shared: its own series carry no pod


def test_claims_with_share_ids_share_the_gpu(dgx):
    shared = [claim("inference", "vllm-llama-70b-5d8f7c9b6-x2kqp", "vllm", dgx.gpu(2), share_id="a1"),
              claim("inference", "triton-resnet-6c9f8d7b5-q8wzt", "triton", dgx.gpu(2), share_id="b2")]
    found = dgx.attribute(shared)
    assert whole(found) == {(2, "vllm-llama-70b-5d8f7c9b6-x2kqp"): 0.5, (2, "triton-resnet-6c9f8d7b5-q8wzt"): 0.5}
    # One claim with a share ID holds the whole GPU so far, and the GPU is still shared.
    alone = dgx.attribute(shared[:1])
    assert whole(alone) == {(2, "vllm-llama-70b-5d8f7c9b6-x2kqp"): 1}
    assert alone.devices[2].sharing_mode((2, None)) == "time_slicing"


def test_containers_of_one_claim_split_it(dgx):
    dgx.pods[("inference", "pair")] = PodInfo(
        uid="uid-pair", name="pair", namespace="inference", phase="Running",
        containers=[ContainerInfo("a", "cid-a"), ContainerInfo("b", "cid-b")],
    )
    found = dgx.attribute([claim("inference", "pair", c, dgx.gpu(7), name="pair-gpu") for c in ("a", "b")])
    assert sorted(w.gpus for w in found.workloads if w.holder.pod == "pair") == [0.5, 0.5]
    assert found.devices[IDLE_GPU].sharing_mode((IDLE_GPU, None)) == "none"


def test_the_admin_access_monitor_owns_nothing(dgx):
    found = dgx.attribute(dgx.whole_gpu_claims() + dgx.monitor_claims())
    assert found.problems == []
    assert MONITOR[1] not in {w.holder.pod for w in found.workloads}
    # Its claims neither share the GPUs it watches nor allocate the idle one.
    assert set(whole(found).values()) == {1}
    assert {view.sharing_mode((i, None)) for i, view in found.devices.items()} == {"none"}
    assert not found.devices[IDLE_GPU].state.allocated
    row = funnel(found)
    assert (row["allocatable"], row["allocated"]) == (8, 7)


def test_a_monitor_not_run_by_a_daemonset_is_known_by_its_overlap(dgx):
    found = dgx.attribute(dgx.whole_gpu_claims() + dgx.monitor_claims(controller_kind="ReplicaSet"))
    assert MONITOR[1] not in {w.holder.pod for w in found.workloads}
    assert not found.devices[IDLE_GPU].state.allocated


def test_a_job_holding_every_gpu_alone_is_an_owner(dgx):
    dgx.add_pod("ml", "allreduce", controller_kind="Job")
    found = dgx.attribute([claim("ml", "allreduce", "main", dgx.gpu(i)) for i in dgx.devices])
    assert whole(found) == {(i, "allreduce"): 1 for i in dgx.devices}
    assert all(view.state.allocated for view in found.devices.values())


def test_a_name_that_maps_to_no_gpu_is_one_problem(dgx):
    found = dgx.attribute(dgx.whole_gpu_claims() + [claim("ml", "ghost", "main", "gpu-42")])
    assert found.problems == ["ml/ghost/main (claim ml/ghost-gpus): device gpu-42 matches no GPU or MIG instance "
                              "NVML sees"]
    assert "ghost" not in {w.holder.pod for w in found.workloads}


@pytest.mark.parametrize("name, ref", [
    ("gpu-3", DraDeviceRef("gpu-3", minor=3)),
    ("gpu-0-mig-1g10gb-19-0", DraDeviceRef("gpu-0-mig-1g10gb-19-0", 0, True, "1g10gb", 19, 0)),
    ("gpu-1-mig-1g10gb-me-20-6", DraDeviceRef("gpu-1-mig-1g10gb-me-20-6", 1, True, "1g10gb-me", 20, 6)),
    ("gpu-2-mig-9-4-4", DraDeviceRef("gpu-2-mig-9-4-4", 2, True, None, 9, 4, 4)),
])
def test_dra_names_parse(name, ref):
    assert parse_dra_name(name) == ref


@pytest.mark.parametrize("name", ["gpu-", "GPU-0", "gpu-0-mig-19-0", "gpu-vfio-0", "nvidia0", "gpu-0-mig-1g10gb"])
def test_unknown_dra_names_are_refused(name):
    with pytest.raises(ValueError, match="unrecognised gpu.nvidia.com device name"):
        parse_dra_name(name)
