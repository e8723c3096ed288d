"""An old driver (scenario legacy-driver: 470, a V100 and a Quadro P4000) that lacks newer NVML symbols."""

import logging

import pytest
import yaml
from datadog_checks.base import AgentCheck
from datadog_checks.dev.utils import get_metadata_metrics

from gpu_monitoring.simulator.scenario import SCENARIO_DIR

MIB = 1024 * 1024
V100, P4000 = 0, 1
RUNS = 3


@pytest.fixture
def legacy(node):
    return node("legacy-driver").run(RUNS)


def test_memory_through_the_v1_query(legacy):
    assert legacy.values("memory.total") == {V100: 32510 * MIB, P4000: 8192 * MIB}
    # Used memory is what the processes hold (the v1 struct has no reserved part).
    assert legacy.values("memory.used") == {V100: 28400 * MIB, P4000: 3100 * MIB}
    assert legacy.values("memory.free") == {V100: (32510 - 28400) * MIB, P4000: (8192 - 3100) * MIB}
    assert legacy.values("memory.reserved") == {}
    assert legacy.sim.calls["nvmlDeviceGetMemoryInfo"] > 0


def test_processes_through_the_v2_query(legacy):
    assert legacy.values("processes.count") == {V100: 1, P4000: 1}
    assert legacy.sim.calls["nvmlDeviceGetComputeRunningProcesses_v2"] > 0


def test_clock_events_through_the_throttle_reasons_query(legacy):
    assert legacy.sim.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2 * RUNS
    for reason in ("gpu_idle", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"):
        assert legacy.values(f"clocks_event.{reason}") == {V100: 0, P4000: 0}, reason
    assert legacy.values("throttled") == {V100: 0, P4000: 0}
    assert legacy.values("clock.sm.max") == {V100: 1530, P4000: 1480}
    sm = legacy.values("clock.sm")
    assert 0 < sm[V100] <= 1530 and 0 < sm[P4000] <= 1480


def test_device_specific_metrics(legacy):
    # Page retirement (V100): three pages retired for single-bit errors before the scenario began.
    assert legacy.values("retired_pages.single_bit") == {V100: 3}
    assert legacy.values("retired_pages.double_bit") == {V100: 0}
    assert legacy.values("retired_pages.pending") == {V100: 0}
    assert legacy.values("remapped_rows.pending") == {}
    # The P4000 is fan-cooled; its fan turns at 30 % plus 0.6 x utilization.
    fan = legacy.values("fan.speed")
    assert set(fan) == {P4000}
    assert 30 <= fan[P4000] <= 90
    # Only the Quadro encodes video here.
    assert set(legacy.values("utilization.encoder")) == {P4000}
    assert 0 <= legacy.values("utilization.encoder")[P4000] <= 20
    # The V100 has NVLink and ECC; the P4000 has neither.
    assert legacy.values("nvlink.links.active") == {V100: 6}
    assert set(legacy.values("ecc.errors.uncorrected")) == {V100}
    assert set(legacy.values("energy.consumed")) == {V100}
    assert set(legacy.values("pcie.throughput.tx")) == {V100}
    assert set(legacy.values("memory.bar1.total")) == {V100}
    assert legacy.values("pcie.link.generation") == {V100: 3, P4000: 3}
    assert legacy.values("power.limit") == {V100: 300, P4000: 105}
    utilization = legacy.values("utilization.gpu")
    assert 0 < utilization[P4000] < utilization[V100] <= 100


def test_no_gpm_and_no_mig(legacy):
    assert legacy.series("sm_active") == []
    assert legacy.series("mig.enabled") == []


@pytest.mark.parametrize(
    "function, answered_per_run, refusing_devices",
    [
        ("nvmlDeviceGetFanSpeed", 1, 1),  # the P4000 answers; the V100 refuses once
        ("nvmlDeviceGetPcieThroughput", 2, 1),  # V100 TX and RX; the P4000 refuses TX once and is never asked RX
        ("nvmlDeviceGetBAR1MemoryInfo", 1, 1),  # the V100 answers; the P4000 refuses
        ("nvmlDeviceGetEncoderUtilization", 1, 1),  # the P4000 answers; the V100 refuses
        ("nvmlDeviceGetDecoderUtilization", 1, 1),  # the P4000 answers; the V100 refuses
        ("nvmlDeviceGetMigMode", 0, 2),  # neither GPU is MIG capable
    ],
)
def test_unsupported_functions_are_asked_once_per_device(node, function, answered_per_run, refusing_devices):
    legacy = node("legacy-driver").run(RUNS)
    assert legacy.sim.calls[function] == answered_per_run * RUNS + refusing_devices


def test_unsupported_functions_are_asked_at_most_once_per_device(node):
    legacy = node("legacy-driver").run()
    legacy.sim.calls.clear()
    legacy.run(2)
    later = legacy.sim.calls
    assert later["nvmlDeviceGetMigMode"] == 0
    assert later["nvmlDeviceGetFanSpeed"] == 2 * 1
    assert later["nvmlDeviceGetPcieThroughput"] == 2 * 2
    assert later["nvmlDeviceGetTemperature"] == 2 * 2


def test_missing_symbols_are_never_called(legacy):
    missing = legacy.sim.scenario.missing_functions
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in missing
    for symbol in missing:
        assert not hasattr(legacy.sim.library, symbol)
        assert legacy.sim.calls[symbol] == 0, symbol


def test_healthy_and_quiet(node, caplog, aggregator, datadog_agent):
    caplog.set_level(logging.WARNING)
    legacy = node("legacy-driver").run(RUNS)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert legacy.sim.failures == []
    assert legacy.statuses() == {V100: AgentCheck.OK, P4000: AgentCheck.OK}
    aggregator.assert_metric("gpu_monitoring.devices.count", value=2)
    aggregator.assert_metrics_using_metadata(get_metadata_metrics(), check_submission_type=True)
    for stub in legacy.series("temperature"):
        assert "gpu_driver_version:470.256.02" in stub.tags
    architectures = {t for s in legacy.series("temperature") for t in s.tags if t.startswith("gpu_architecture:")}
    assert architectures == {"gpu_architecture:volta", "gpu_architecture:pascal"}
    # Product names as the Agent's gpu check tags them: lowercase, `_` for spaces, dashes kept.
    devices = {t for s in legacy.series("temperature") for t in s.tags if t.startswith("gpu_device:")}
    assert devices == {"gpu_device:tesla_v100-sxm2-32gb", "gpu_device:quadro_p4000"}
    datadog_agent.assert_metadata(
        legacy.check.check_id,
        {"driver_version": "470.256.02", "nvml_version": "11.470.256.02", "cuda_driver_version": "11.4"},
    )


# A driver older than 470 (418, CUDA 10.1) has neither the `_v2` nor the `_v3` process queries.
V1_ONLY_MISSING = [
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
]


@pytest.fixture
def v1_only(node, tmp_path):
    scenario = yaml.safe_load((SCENARIO_DIR / "legacy-driver.yaml").read_text())
    scenario["driver"] = {"version": "418.226.00", "nvml_version": "10.418.226.00", "cuda_version": 10010}
    scenario["missing_functions"] += V1_ONLY_MISSING
    path = tmp_path / "driver-418.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return node(str(path)).run(RUNS)


def test_processes_through_the_unversioned_query(v1_only):
    assert v1_only.values("processes.count") == {V100: 1, P4000: 1}
    memory = v1_only.keyed("process.memory.used", lambda t: int(t["pid"]))
    assert memory == {9101: 28400 * MIB, 9202: 3100 * MIB}
    names = {t for s in v1_only.series("process.memory.used") for t in s.tags if t.startswith("process_name:")}
    assert names == {"process_name:python", "process_name:blender"}
    assert v1_only.sim.calls["nvmlDeviceGetComputeRunningProcesses"] > 0
    for symbol in V1_ONLY_MISSING:
        assert v1_only.sim.calls[symbol] == 0, symbol

