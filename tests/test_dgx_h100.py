"""A healthy DGX H100 (scenario dgx-h100): every metric group with the values the node should show.
The one thing wrong on it: a process a failed pod left behind holds memory on GPU 7, which nobody holds."""

import pytest
import yaml
from datadog_checks.base import AgentCheck
from datadog_checks.dev.utils import get_metadata_metrics

from gpu_monitoring.metrics.spec import SPEC
from gpu_monitoring.simulator.scenario import SCENARIO_DIR

from .conftest import tag_dict

MIB = 1024 * 1024
GPUS = range(8)
BUSY = [0, 1, 2, 3, 4, 6]
IDLE = [5, 7]  # no utilization: GPU 5 runs nothing, GPU 7 only the failed pod's process
DEVICES = yaml.safe_load((SCENARIO_DIR / "dgx-h100.yaml").read_text())["devices"]
MEMORY_USED_MIB = [device["load"]["memory_used_mib"] for device in DEVICES]
PIDS = [[process["pid"] for process in device.get("processes", [])] for device in DEVICES]
ZOMBIE_GPU, ZOMBIE_PID = 7, 90114
IDLE_W, LIMIT_W = 72, 700
SLOWDOWN_C = 89
# Lowercase, as the Agent's gpu check tags them (the scenario writes them as NVML does).
PCI_BUS_IDS = [
    "00000000:18:00.0", "00000000:2a:00.0", "00000000:3a:00.0", "00000000:5d:00.0",
    "00000000:9a:00.0", "00000000:ab:00.0", "00000000:ba:00.0", "00000000:db:00.0",
]
GPM = ["sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active", "fp32_active", "fp16_active",
       "graphics_active"]
DESIGN_TAGS = {"gpu_uuid", "gpu_parent_uuid", "gpu_index", "gpu_device", "gpu_architecture", "gpu_driver_version",
               "gpu_pci_bus_id", "gpu_slicing_mode", "gpu_sharing_mode"}


@pytest.fixture
def dgx(node):
    """The node after two runs (t=0 and t=15), so rates and GPM have a previous sample."""
    return node("dgx-h100").run(2)


def test_node_and_connection(dgx, aggregator):
    aggregator.assert_metric("gpu_monitoring.devices.count", value=8, tags=[], count=1,
                             metric_type=aggregator.GAUGE)
    aggregator.assert_service_check("gpu_monitoring.nvml.can_connect", status=AgentCheck.OK, count=1)
    assert aggregator.events == []
    assert dgx.sim.failures == []


def test_utilization(dgx):
    gpu, memory = dgx.values("utilization.gpu"), dgx.values("utilization.memory")
    decoder = dgx.values("utilization.decoder")
    assert set(gpu) == set(memory) == set(decoder) == set(GPUS)
    for index in GPUS:
        assert 0 <= gpu[index] <= 100 and 0 <= memory[index] <= 100 and 0 <= decoder[index] <= 100
    for index in BUSY:
        assert gpu[index] > 10
        assert 0 < memory[index] < gpu[index]
    # GPU 0 trains at 88 % +- 8 % (+ 2 % jitter).
    assert 78 <= gpu[0] <= 98
    # An H100 has no NVENC, yet its driver answers the encoder's utilization, as a real one does: 0.
    assert dgx.values("utilization.encoder") == dict.fromkeys(GPUS, 0)


def test_memory(dgx):
    total, used, free, reserved = (dgx.values(f"memory.{k}") for k in ("total", "used", "free", "reserved"))
    for index in GPUS:
        assert total[index] == 81559 * MIB
        assert reserved[index] == 551 * MIB
        assert used[index] + free[index] + reserved[index] == total[index]
    # What the scenario's processes hold: GPU 7's too, though the pod that started its process failed.
    assert used == {index: MEMORY_USED_MIB[index] * MIB for index in GPUS}
    assert used[5] == 0 and used[ZOMBIE_GPU] > 0
    bar1_total, bar1_used = dgx.values("memory.bar1.total"), dgx.values("memory.bar1.used")
    for index in GPUS:
        assert bar1_total[index] == 131072 * MIB
        assert 0 < bar1_used[index] < bar1_total[index]


def test_power_and_thermal(dgx):
    usage, limit = dgx.values("power.usage"), dgx.values("power.limit")
    temperature, memory_temperature = dgx.values("temperature"), dgx.values("temperature.memory")
    threshold = dgx.values("temperature.slowdown_threshold")
    for index in GPUS:
        assert limit[index] == LIMIT_W
        assert IDLE_W <= usage[index] <= LIMIT_W
        assert threshold[index] == SLOWDOWN_C
        assert 25 <= temperature[index] < SLOWDOWN_C
        assert temperature[index] < memory_temperature[index] < SLOWDOWN_C + 10
    for index in IDLE:
        assert usage[index] == IDLE_W
    for index in BUSY:
        assert usage[index] > IDLE_W + 50
    # The busiest GPU runs hotter than an idle one.
    assert temperature[0] > temperature[7]
    # H100 SXM is cooled by the chassis: no fan reading.
    assert dgx.values("fan.speed") == {}


def test_energy_is_a_monotonic_count_that_grows_by_the_power_drawn(node, aggregator):
    dgx = node("dgx-h100").run()
    first = dgx.values("energy.consumed")
    dgx.run()
    second = dgx.values("energy.consumed")
    for stub in dgx.series("energy.consumed"):
        assert stub.type == aggregator.MONOTONIC_COUNT
    assert set(first) == set(second) == set(GPUS)
    for index in GPUS:
        # The raw counter is in joules since the driver loaded (520 MJ at the start of the scenario).
        assert first[index] >= 520e6
        watts = (second[index] - first[index]) / 15
        assert IDLE_W - 1 <= watts <= LIMIT_W
    for index in IDLE:
        assert second[index] - first[index] == pytest.approx(IDLE_W * 15, rel=0.01)


def test_clocks(dgx):
    sm, sm_max = dgx.values("clock.sm"), dgx.values("clock.sm.max")
    memory, memory_max = dgx.values("clock.memory"), dgx.values("clock.memory.max")
    graphics, video = dgx.values("clock.graphics"), dgx.values("clock.video")
    pstate = dgx.values("performance_state")
    for index in GPUS:
        assert sm_max[index] == 1980
        assert memory_max[index] == 2619
        assert 0 < sm[index] <= sm_max[index]
        assert 0 < graphics[index] <= 1980
        assert 0 < video[index] <= 1755
        assert memory[index] <= memory_max[index]
    for index in BUSY:
        assert sm[index] > sm[5]
        assert pstate[index] == 0
    # An idle GPU drops to P8 only with no process on it: a process's context holds it in P0.
    for index in IDLE:
        assert pstate[index] == (0 if PIDS[index] else 8)


def test_idle_gpus(dgx):
    utilization, idle = dgx.values("utilization.gpu"), dgx.values("clocks_event.gpu_idle")
    for index in IDLE:
        assert utilization[index] == 0
        assert idle[index] == 1
        assert dgx.values("processes.count")[index] == len(PIDS[index])
    for index in BUSY:
        assert idle[index] == 0


def test_no_gpu_is_throttled(dgx):
    reasons = ["applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal_slowdown",
               "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    for reason in reasons:
        assert dgx.values(f"clocks_event.{reason}") == dict.fromkeys(GPUS, 0), reason
    assert dgx.values("throttled") == dict.fromkeys(GPUS, 0)


def test_pcie(dgx):
    assert dgx.values("pcie.link.generation") == dict.fromkeys(GPUS, 5)
    assert dgx.values("pcie.link.width") == dict.fromkeys(GPUS, 16)
    assert dgx.values("pcie.link.generation.max") == dict.fromkeys(GPUS, 5)
    assert dgx.values("pcie.link.width.max") == dict.fromkeys(GPUS, 16)
    assert dgx.values("pcie.replay_errors") == dict.fromkeys(GPUS, 3)
    tx, rx = dgx.values("pcie.throughput.tx"), dgx.values("pcie.throughput.rx")
    # Gen5 x16 carries about 64 GB/s each way.
    for index in BUSY:
        assert 0 < tx[index] < rx[index] < 64e9
    for index in IDLE:
        assert tx[index] == rx[index] == 0


def test_nvlink(node):
    dgx = node("dgx-h100").run()
    # Throughput is a rate between two runs: none on the first.
    assert dgx.values("nvlink.throughput.tx") == {}
    assert dgx.values("nvlink.links.active") == dict.fromkeys(GPUS, 18)
    dgx.run()
    assert dgx.values("nvlink.links.active") == dict.fromkeys(GPUS, 18)
    tx, rx = dgx.values("nvlink.throughput.tx"), dgx.values("nvlink.throughput.rx")
    for index in BUSY:
        # 18 NVLink 4 links carry at most 18 x 25 GB/s each way.
        assert 1e9 < tx[index] < 18 * 25e9
        assert rx[index] == pytest.approx(tx[index] * 0.97, rel=0.01)
    for index in IDLE:
        assert tx[index] == rx[index] == 0
    for counter in ("crc_flit", "crc_data", "replay", "recovery"):
        assert dgx.values(f"nvlink.errors.{counter}") == dict.fromkeys(GPUS, 0)


def test_gpm_needs_two_samples(node, aggregator):
    dgx = node("dgx-h100").run()
    for metric in GPM:
        assert dgx.series(metric) == [], f"{metric} on the first run, before GPM has a previous sample"
    dgx.run()
    values = {metric: dgx.values(metric) for metric in GPM}
    for metric in GPM:
        assert set(values[metric]) == set(GPUS), metric
        assert all(0 <= v <= 100 for v in values[metric].values()), metric
    for index in BUSY:
        assert 0 < values["sm_active"][index] <= values["graphics_active"][index]
        assert values["sm_occupancy"][index] < values["sm_active"][index]
        assert values["fp64_active"][index] < values["fp32_active"][index]
    for index in IDLE:
        assert all(values[metric][index] == 0 for metric in GPM)
    # GPU 2 serves inference with few tensor-core kernels (profile tensor 0.2), GPU 0 trains (0.5).
    assert values["tensor_active"][2] / values["graphics_active"][2] == pytest.approx(0.2)
    assert values["tensor_active"][0] / values["graphics_active"][0] == pytest.approx(0.5)


def test_errors_processes_and_mig(dgx, aggregator):
    for metric in ("ecc.errors.corrected", "ecc.errors.uncorrected"):
        assert dgx.values(metric) == dict.fromkeys(GPUS, 0)
        assert {s.type for s in dgx.series(metric)} == {aggregator.MONOTONIC_COUNT}
    for metric in ("remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
                   "remapped_rows.failed"):
        assert dgx.values(metric) == dict.fromkeys(GPUS, 0)
    # H100 remaps rows; it does not retire pages.
    assert dgx.series("retired_pages.single_bit") == []
    assert dgx.values("processes.count") == {index: len(PIDS[index]) for index in GPUS}
    assert dgx.values("mig.enabled") == dict.fromkeys(GPUS, 0)
    assert dgx.series("mig.instances") == []
    assert dgx.series("xid_errors") == []


# The pods that hold each GPU (scenario dgx-h100), each by one container. GPU 7 was given to no pod: the
# process a failed pod left on it makes it nobody's.
HOLDERS = {
    0: ("llm-pretrain-0", "ml-training", "trainer"),
    1: ("llm-pretrain-0", "ml-training", "trainer"),
    2: ("vllm-llama-70b-5d8f7c9b6-x2kqp", "inference", "vllm"),
    3: ("triton-resnet-6c9f8d7b5-q8wzt", "inference", "triton"),
    4: ("jupyter-alice", "research", "notebook"),
    5: ("jupyter-bob", "research", "notebook"),
    6: ("finetune-mistral-7b-0", "ml-training", "trainer"),
}
POD_TAGS = {"pod_name", "kube_namespace", "kube_container_name", "container_id"}
# The tag that names the part of the GPU a series is of (a memory location, a slowdown reason).
PART_TAGS = ("memory_location:", "throttle_reason:")
# Inventory: the GPU's own tags and its VBIOS, not its holder's (pods coming and going make no new series).
INVENTORY = "gpu_monitoring.device.persistence_mode"
# The node's own series and its ports': no GPU's tags.
NODE_METRICS = {metric.full_name for metric in SPEC.values() if metric.scope in ("node", "port")}


def test_device_tags(dgx, aggregator):
    # Device series: every metric but the node's own and the per-process and per-workload ones.
    device_series = [
        stub
        for name in aggregator.metric_names
        if name not in NODE_METRICS | {INVENTORY}
        and not name.startswith(("gpu_monitoring.process.", "gpu_monitoring.workload."))
        for stub in aggregator.metrics(name)
        # A link's series carries its GPU's tags and its nvlink_port: tests/test_nvlink.py.
        if "nvlink_port" not in tag_dict(stub.tags)
    ]
    assert len(device_series) > 8 * 50
    container_ids = {}
    for stub in device_series:
        stub = stub._replace(tags=[tag for tag in stub.tags if not tag.startswith(PART_TAGS)])
        tags = tag_dict(stub.tags)
        assert DESIGN_TAGS <= set(tags), (stub.name, stub.tags)
        index = int(tags["gpu_index"])
        assert tags["gpu_device"] == "nvidia_h100_80gb_hbm3"
        assert tags["gpu_architecture"] == "hopper"
        assert tags["gpu_driver_version"] == "550.90.07"
        assert (tags["gpu_slicing_mode"], tags["gpu_sharing_mode"]) == ("none", "none")
        assert tags["gpu_pci_bus_id"] == PCI_BUS_IDS[index]
        assert tags["gpu_uuid"].startswith("gpu-")
        # A whole GPU is its own parent, as in the Agent's gpu check.
        assert tags["gpu_parent_uuid"] == tags["gpu_uuid"]
        if index in HOLDERS:
            # Exactly one container holds the GPU: its series carry that container's pod tags too.
            assert set(tags) == DESIGN_TAGS | POD_TAGS, (stub.name, stub.tags)
            assert len(stub.tags) == len(DESIGN_TAGS | POD_TAGS), (stub.name, stub.tags)
            assert (tags["pod_name"], tags["kube_namespace"], tags["kube_container_name"]) == HOLDERS[index]
            assert len(tags["container_id"]) == 64
            container_ids.setdefault(tags["pod_name"], set()).add(tags["container_id"])
        else:
            assert len(stub.tags) == len(DESIGN_TAGS), (stub.name, stub.tags)
    # One container ID per pod (llm-pretrain-0 holds two GPUs with one container), six pods.
    assert {pod: len(ids) for pod, ids in container_ids.items()} == dict.fromkeys(
        {pod for pod, _, _ in HOLDERS.values()}, 1
    )
    uuids = {tag_dict(s.tags)["gpu_index"]: tag_dict(s.tags)["gpu_uuid"] for s in device_series}
    assert len(uuids) == 8 and len(set(uuids.values())) == 8
    # The same GPU has the same UUID on every series.
    for stub in device_series:
        assert uuids[tag_dict(stub.tags)["gpu_index"]] == tag_dict(stub.tags)["gpu_uuid"]


def test_instance_tags_are_added(node, aggregator):
    dgx = node("dgx-h100", tags=["team:ml", "rack:a7"]).run()
    aggregator.assert_metric("gpu_monitoring.devices.count", value=8, tags=["team:ml", "rack:a7"])
    for stub in dgx.series("temperature"):
        assert {"team:ml", "rack:a7"} <= set(stub.tags)
    for stub in aggregator.service_checks("gpu_monitoring.device.health"):
        assert {"team:ml", "rack:a7"} <= set(stub.tags)
    aggregator.assert_service_check(
        "gpu_monitoring.nvml.can_connect", status=AgentCheck.OK, tags=["team:ml", "rack:a7"], count=1
    )


def test_metrics_match_metadata(dgx, aggregator):
    aggregator.assert_metrics_using_metadata(get_metadata_metrics(), check_submission_type=True)


def test_all_gpus_healthy_but_the_zombies(dgx):
    health = dgx.health()
    assert set(health) == set(GPUS)
    assert ZOMBIE_PID in PIDS[ZOMBIE_GPU]
    for index, stub in health.items():
        assert "gpu_slicing_mode:none" in stub.tags
        if index == ZOMBIE_GPU:
            # Memory nobody will free on a GPU nobody holds: the next pod given it starts with less.
            assert stub.status == AgentCheck.WARNING
            assert f"pid {ZOMBIE_PID} (pod ml-training/batch-eval-7f9c is Failed)" in stub.message
        else:
            assert stub.status == AgentCheck.OK
            assert not stub.message


def test_versions_are_check_metadata(node, datadog_agent):
    dgx = node("dgx-h100").run()
    datadog_agent.assert_metadata(
        dgx.check.check_id,
        {"driver_version": "550.90.07", "nvml_version": "12.550.90.07", "cuda_driver_version": "12.4"},
    )
