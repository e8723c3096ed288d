"""The share of each interval the clocks were held down, per reason (clocks_event.time_percent):
from the driver's per-reason time counters, whose field IDs depend on the driver's own nvml.h.

Scenario faults: GPU 4 is in thermal slowdown from t=20 to t=80; the check runs every 15 s."""

import pynvml
import pytest
import yaml

from gpu_monitoring.simulator.scenario import resolve

METRIC = "clocks_event.time_percent"
TIMED = {"sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
CURRENT_IDS = {
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
}
CUDA_12_9_IDS = {251, 252, 253}  # the same counters as CUDA 12.9 and 13.0's nvml.h numbered them


def on_driver(directory, version):
    """Scenario faults on another driver version, under its own file name (GPU UUIDs come from the name)."""
    raw = yaml.safe_load(resolve("faults").read_text())
    raw["driver"] = dict(raw["driver"], version=version)
    path = directory / "faults.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def shares(simulated):
    """{(gpu index, reason): percent} of the last run."""
    return simulated.keyed(METRIC, lambda t: (int(t["gpu_index"]), t["throttle_reason"]))


def asked(simulated):
    return {field_id for _, field_id in simulated.sim.field_requests}


@pytest.mark.parametrize("driver, ids", [("590.44.01", CURRENT_IDS), ("580.65.06", CUDA_12_9_IDS)])
def test_the_share_of_the_interval_each_reason_held_the_clocks(node, tmp_path, driver, ids):
    faults = node(on_driver(tmp_path, driver))
    faults.run()
    assert shares(faults) == {}  # a share needs two reads
    faults.run_until(30)
    found = shares(faults)
    assert set(found) == {(gpu, reason) for gpu in range(6) if gpu != 2 for reason in TIMED}  # GPU 2 is lost
    # The slowdown began at t=20: 10 s of the 15 since the last run (runs start a moment past t=0).
    slowed = {(4, "sw_thermal_slowdown"), (4, "hw_thermal_slowdown")}
    for key in slowed:
        assert found[key] == pytest.approx(100 * 10 / 15, abs=1)
    others = set(found) - slowed
    assert {key: found[key] for key in others} == dict.fromkeys(others, 0)
    faults.run_until(60)
    assert shares(faults)[4, "hw_thermal_slowdown"] == 100
    faults.run_until(90)  # over at t=80: 5 s of 15
    assert shares(faults)[4, "hw_thermal_slowdown"] == pytest.approx(100 * 5 / 15, abs=1)
    assert ids <= asked(faults)
    assert not (CURRENT_IDS | CUDA_12_9_IDS) - ids & asked(faults)


def test_the_flags_stay_beside_the_shares(node, tmp_path):
    faults = node(on_driver(tmp_path, "590.44.01")).run_until(30)
    assert faults.values("clocks_event.hw_thermal_slowdown")[4] == 1
    assert faults.values("throttled")[4] == 1


def test_a_driver_before_the_slowdown_counters_times_only_the_power_cap_and_sync_boost(node):
    faults = node("faults").run_until(30)  # driver 550
    assert {reason for _, reason in shares(faults)} == {"sw_power_cap", "sync_boost"}
    assert not (CURRENT_IDS | CUDA_12_9_IDS) & asked(faults)


def test_a_refused_counter_gives_no_series_and_is_asked_once(node, tmp_path):
    raw = yaml.safe_load(open(on_driver(tmp_path, "590.44.01")).read())
    raw["refused_fields"] = ["NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST"]
    (tmp_path / "faults.yaml").write_text(yaml.safe_dump(raw))
    faults = node(str(tmp_path / "faults.yaml")).run_until(45)
    assert "sync_boost" not in {reason for _, reason in shares(faults)}
    sync_boost = pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST
    assert {gpu: n for (gpu, field_id), n in faults.sim.field_requests.items() if field_id == sync_boost} == \
        dict.fromkeys(range(6), 1)


@pytest.mark.parametrize("profile, sent", [("essential", False), ("standard", True)])
def test_the_profile_that_sends_the_shares_asks_for_the_counters(node, tmp_path, profile, sent):
    faults = node(on_driver(tmp_path, "590.44.01"), metrics_profile=profile).run_until(30)
    assert bool(shares(faults)) is sent
    assert bool(CURRENT_IDS & asked(faults)) is sent
