"""Lifetime ECC totals (ecc.errors.{corrected,uncorrected}.total): the GPU's, and by memory location
where the driver counts them apart, from the one batched field read."""

import pynvml
import pytest
import yaml

from gpu_monitoring.simulator.scenario import resolve

KINDS = ("corrected", "uncorrected")
PRE_TURING_LOCATIONS = {"device_memory", "l1_cache", "l2_cache", "register_file", "texture_memory"}
AGGREGATE_IDS = {
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_DEV, pynvml.NVML_FI_DEV_ECC_DBE_AGG_DEV,
}


def totals(simulated, kind):
    """{(gpu index, memory location or None for the GPU's total): value} of the last run."""
    return simulated.keyed(f"ecc.errors.{kind}.total", lambda t: (int(t["gpu_index"]), t.get("memory_location")))


def test_the_totals_follow_the_timelines_errors(node, aggregator):
    faults = node("faults").run_until(30)  # 2 uncorrectable errors on GPU 3 at t=20; GPU 2 lost
    gpus = [0, 1, 3, 4, 5]
    for kind in KINDS:
        # Hopper counts DRAM and SRAM apart: the field IDs give the device memory's alone.
        assert set(totals(faults, kind)) == {(gpu, where) for gpu in gpus for where in (None, "device_memory")}
    assert totals(faults, "uncorrected")[3, None] == totals(faults, "uncorrected")[3, "device_memory"] == 2
    assert totals(faults, "uncorrected")[0, None] == 0
    assert set(totals(faults, "corrected").values()) == {0}
    assert {s.type for s in faults.series("ecc.errors.uncorrected.total")} == {aggregator.GAUGE}


def test_the_lifetime_counts_include_those_before_this_boot(node, tmp_path):
    raw = yaml.safe_load(resolve("faults").read_text())
    raw["models"]["h100-pcie"]["counters"] = {"ecc_sbe_aggregate": 12, "ecc_dbe_aggregate": 1}
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(raw))
    faults = node(str(path)).run_until(30)
    assert totals(faults, "corrected")[0, None] == 12
    assert totals(faults, "uncorrected")[3, None] == 1 + 2
    assert faults.values("ecc.errors.uncorrected")[3] == 2  # the volatile count: this boot's only


def test_a_pre_turing_gpu_counts_every_location(node):
    legacy = node("legacy-driver").run()
    v100 = 0
    assert {where for gpu, where in totals(legacy, "corrected") if gpu == v100} == PRE_TURING_LOCATIONS | {None}
    # nvml.h counts only uncorrected errors in the CBU.
    assert {where for gpu, where in totals(legacy, "uncorrected") if gpu == v100} == \
        PRE_TURING_LOCATIONS | {"cbu", None}
    assert {gpu for gpu, _ in totals(legacy, "corrected")} == {v100}  # the Quadro has no ECC


@pytest.mark.parametrize("profile, sent", [("essential", False), ("standard", True)])
def test_the_profile_that_sends_the_totals_asks_for_them(node, profile, sent):
    faults = node("faults", metrics_profile=profile).run_until(15)
    assert bool(totals(faults, "uncorrected")) is sent
    asked = {field_id for _, field_id in faults.sim.field_requests}
    assert bool(AGGREGATE_IDS & asked) is sent
