"""MIG (scenario a100-mig, and an H100 with GPM split in two): instances, their tags, and NVML refusals."""

import logging

from datadog_checks.base import AgentCheck

from .conftest import H100_PCIE_NODE, tag_dict

MIB = 1024 * 1024
PHYSICAL = [0, 1, 2, 3]
MIG_GPUS = [0, 1, 3]
INSTANCES = {
    # (gpu index, gpu instance id): (profile, memory MiB, process memory MiB, processes)
    (0, 2): ("3g.40gb", 40192, 31000, 1),
    (0, 3): ("2g.20gb", 19968, 12000, 1),
    (0, 9): ("1g.10gb", 9856, 4000, 1),
    (0, 10): ("1g.10gb", 9856, 0, 0),
    (1, 7): ("1g.10gb", 9856, 8000, 1),
    (1, 8): ("1g.10gb", 9856, 8000, 1),
    (1, 9): ("1g.10gb", 9856, 8000, 1),
    (1, 10): ("1g.10gb", 9856, 6000, 1),
    (1, 11): ("1g.10gb", 9856, 0, 0),
    (1, 12): ("1g.10gb", 9856, 0, 0),
    (1, 13): ("1g.10gb", 9856, 2000, 1),
    (3, 0): ("7g.80gb", 80896, 70000, 1),
}

H100_MIG_SCENARIO = H100_PCIE_NODE + """
description: One H100 with GPM split into two MIG instances.
devices:
  - model: h100
    mig:
      - {profile: 3g.40gb, gi: 1, memory_mib: 40192, utilization: 80, processes: [{pid: 11, memory_mib: 30000}]}
      - {profile: 1g.10gb, gi: 5, memory_mib: 9856, utilization: 20}
"""


def slicing_mode(tags):
    return tag_dict(tags).get("gpu_slicing_mode")


def test_instances_per_gpu(node):
    mig = node("a100-mig").run(2)
    assert mig.values("mig.enabled") == {0: 1, 1: 1, 2: 0, 3: 1}
    # GPU 2 has MIG off: no instance count at all.
    assert mig.values("mig.instances") == {0: 4, 1: 7, 3: 1}
    assert set(mig.instance_values("memory.total")) == set(INSTANCES)


def test_instance_tags(node):
    mig = node("a100-mig").run()
    parents = {}
    for stub in mig.series("memory.total"):
        tags = tag_dict(stub.tags)
        if "gpu_instance_id" not in tags:
            parents[int(tags["gpu_index"])] = tags
    assert parents[2]["gpu_slicing_mode"] == "none"
    for index in MIG_GPUS:
        assert parents[index]["gpu_slicing_mode"] == "mig-parent"
    assert len({p["gpu_uuid"] for p in parents.values()}) == 4

    seen = set()
    for stub in mig.series("memory.total"):
        tags = tag_dict(stub.tags)
        if "gpu_instance_id" not in tags:
            continue
        key = (int(tags["gpu_index"]), int(tags["gpu_instance_id"]))
        parent = parents[key[0]]
        seen.add(key)
        assert tags["gpu_mig_profile"] == INSTANCES[key][0]
        assert tags["gpu_slicing_mode"] == "mig"
        assert tags["gpu_parent_uuid"] == parent["gpu_uuid"]
        assert tags["gpu_uuid"].startswith("mig-") and tags["gpu_uuid"] != parent["gpu_uuid"]
        for name in ("gpu_device", "gpu_architecture", "gpu_driver_version", "gpu_pci_bus_id", "gpu_sharing_mode"):
            assert tags[name] == parent[name], name
        assert tags["gpu_architecture"] == "ampere"
        assert tags["gpu_driver_version"] == "535.183.01"
        # One value per tag name: the parent's UUID and modes are replaced, not repeated.
        assert len(stub.tags) == len(tags)
    assert seen == set(INSTANCES)
    # Instances get their own UUIDs.
    uuids = {tag_dict(s.tags)["gpu_uuid"] for s in mig.series("memory.total")}
    assert len(uuids) == 4 + len(INSTANCES)


def test_instance_memory_and_processes(node):
    mig = node("a100-mig").run()
    total, used = mig.instance_values("memory.total"), mig.instance_values("memory.used")
    free, processes = mig.instance_values("memory.free"), mig.instance_values("processes.count")
    for key, (_profile, memory_mib, used_mib, count) in INSTANCES.items():
        assert total[key] == memory_mib * MIB, key
        assert used[key] == used_mib * MIB, key
        assert free[key] == (memory_mib - used_mib) * MIB, key
        assert processes[key] == count, key
    # A parent in MIG mode counts the processes of all its instances.
    assert mig.values("processes.count") == {0: 3, 1: 5, 2: 1, 3: 1}
    assert mig.values("memory.total") == dict.fromkeys(PHYSICAL, 81920 * MIB)
    assert mig.values("memory.used")[0] == (31000 + 12000 + 4000) * MIB


def test_device_wide_metrics_stay_on_the_parent(node):
    mig = node("a100-mig", dcgm_exporter_url="none").run(2)  # what NVML alone gives
    # Engine utilization: NVML refuses it on MIG parents and on MIG handles; GPU 2 (MIG off) has it.
    assert set(mig.values("utilization.gpu")) == {2}
    assert mig.instance_values("utilization.gpu") == {}
    for metric in ("temperature", "power.usage", "clock.sm", "pcie.link.width", "nvlink.links.active",
                   "memory.bar1.total", "ecc.errors.uncorrected"):
        assert set(mig.values(metric)) == set(PHYSICAL), metric
        assert mig.instance_values(metric) == {}, metric
    assert mig.values("nvlink.links.active") == dict.fromkeys(PHYSICAL, 12)
    assert mig.values("pcie.link.generation") == dict.fromkeys(PHYSICAL, 4)
    # A100 has no GPM.
    assert mig.series("sm_active") == []


def test_energy_follows_the_power_drawn(node):
    # The energy counter is the integral of the power the GPU draws; on a GPU in MIG mode the power
    # comes from its instances' load, and so must the energy.
    mig = node("a100-mig").run()
    energy_before, power_before = mig.values("energy.consumed"), mig.values("power.usage")
    mig.run()
    energy_after, power_after = mig.values("energy.consumed"), mig.values("power.usage")
    watts = {index: (energy_after[index] - energy_before[index]) / 15 for index in PHYSICAL}
    for index in PHYSICAL:
        low = min(power_before[index], power_after[index]) * 0.85
        high = max(power_before[index], power_after[index]) * 1.15
        assert low <= watts[index] <= high, (
            f"GPU {index}: energy grew at {watts[index]:.0f} W while power.usage read "
            f"{power_before[index]:.0f} W and {power_after[index]:.0f} W"
        )


def test_refused_functions_are_not_called_again(node):
    mig = node("a100-mig")
    mig.run()
    first = dict(mig.sim.calls)
    mig.sim.calls.clear()
    mig.run(2)
    later = mig.sim.calls
    # The first run asks every handle (4 GPUs and 12 MIG instances) once.
    assert first["nvmlDeviceGetBAR1MemoryInfo"] == 16
    assert first["nvmlDeviceGetUtilizationRates"] == 16
    # Later runs ask only where NVML answered: BAR1 on the 4 GPUs, utilization on GPU 2.
    assert later["nvmlDeviceGetBAR1MemoryInfo"] == 2 * 4
    assert later["nvmlDeviceGetUtilizationRates"] == 2 * 1
    # No A100 has an encoder load, so NVML refused it everywhere the first time.
    assert later["nvmlDeviceGetEncoderUtilization"] == 0
    # Decoder: refused on the 12 MIG handles, answered by the 4 GPUs.
    assert later["nvmlDeviceGetDecoderUtilization"] == 2 * 4
    # Field values (INVALID_ARGUMENT on MIG handles) are only asked of the GPUs.
    assert later["nvmlDeviceGetFieldValues"] == 2 * 4
    # Memory info is served on MIG handles and asked of all 16 every run.
    assert later["nvmlDeviceGetMemoryInfo_v2"] == 2 * 16
    # Static facts are read once per session.
    for function in ("nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetGpuInstanceId",
                     "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMaxClockInfo"):
        assert later[function] == 0, function


def test_no_warnings_or_errors(node, caplog):
    caplog.set_level(logging.WARNING)
    mig = node("a100-mig").run(3)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert mig.sim.failures == []
    assert mig.statuses() == dict.fromkeys(PHYSICAL, AgentCheck.OK)


def test_processes_not_collected_are_not_reported_as_zero(node):
    # collect_processes: false turns the processes collector off: no processes.count series at all,
    # rather than a 0 for GPUs that do run processes.
    mig = node("a100-mig", collect_processes=False).run()
    assert mig.instance_values("processes.count") == {}
    assert mig.values("processes.count") == {}, (
        "MIG parents report processes.count although processes are not collected; their instances run 3, 5 and 1"
    )


def test_gpm_per_mig_instance(node, tmp_path):
    scenario = tmp_path / "h100-mig.yaml"
    scenario.write_text(H100_MIG_SCENARIO)
    h100 = node(scenario).run()
    assert h100.values("mig.instances") == {0: 2}
    assert h100.series("sm_active") == []
    h100.run()
    sm_active = h100.instance_values("sm_active")
    assert set(sm_active) == {(0, 1), (0, 5)}
    # The parent in MIG mode has no whole-GPU GPM sample.
    assert h100.values("sm_active") == {}
    # Instance 1 runs at 80 % +- 5 %, instance 5 at 20 % +- 5 %; sm_active is 85 % of engine activity.
    assert 0.85 * 72 <= sm_active[(0, 1)] <= 0.85 * 88
    assert 0.85 * 12 <= sm_active[(0, 5)] <= 0.85 * 28
    graphics = h100.instance_values("graphics_active")
    for key in sm_active:
        assert sm_active[key] < graphics[key] <= 100
    profiles = {int(tag_dict(s.tags)["gpu_instance_id"]): tag_dict(s.tags)["gpu_mig_profile"]
                for s in h100.series("sm_active")}
    assert profiles == {1: "3g.40gb", 5: "1g.10gb"}
    assert h100.instance_values("processes.count") == {(0, 1): 1, (0, 5): 0}
    assert h100.sim.failures == []


LOST_MIG_GPU_SCENARIO = H100_PCIE_NODE + """
description: Two H100 PCIe; GPU 1 runs MIG and falls off the bus at t=20 until t=50.
devices:
  - {model: h100, load: {utilization: 50}}
  - {model: h100, mig: [{profile: 3g.40gb, gi: 1, memory_mib: 40192, utilization: 80}]}
faults:
  - {at: 20, kind: xid, device: 1, xid: 79, lost_for: 30}
"""


def test_lost_mig_gpu_keeps_its_slicing_mode_tag(node, tmp_path, aggregator):
    scenario = tmp_path / "lost-mig-gpu.yaml"
    scenario.write_text(LOST_MIG_GPU_SCENARIO)
    h100 = node(scenario).run()
    assert "gpu_slicing_mode:mig-parent" in h100.health()[1].tags
    h100.run_until(30)
    lost = h100.health()[1]
    assert lost.status == AgentCheck.CRITICAL
    # The same GPU is the same series: the CRITICAL health check, the XID event and the XID count
    # carry the tags the GPU had while it was healthy (it was in MIG mode when it fell off the bus).
    assert slicing_mode(lost.tags) == "mig-parent"
    (event,) = aggregator.events
    assert slicing_mode(event["tags"]) == "mig-parent"
    (count,) = h100.series("xid_errors")
    assert slicing_mode(count.tags) == "mig-parent"
