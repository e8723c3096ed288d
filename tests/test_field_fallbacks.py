"""Values behind NVML field IDs come from their dedicated functions where a driver refuses the
fields (scenario h100-no-fields), and which source serves each is learnt once per session."""

import pynvml
import pytest
import yaml
from datadog_checks.base.stubs import aggregator

from gpu_monitoring.simulator.scenario import resolve

from .conftest import NAMESPACE

REFUSED_NAMES = yaml.safe_load(resolve("h100-no-fields").read_text())["refused_fields"]
REFUSED = {getattr(pynvml, name) for name in REFUSED_NAMES}

# Each fallback function and the field IDs whose values it gives.
FALLBACK_FOR = {
    "nvmlDeviceGetTotalEnergyConsumption": {pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION},
    "nvmlDeviceGetPowerUsage": {pynvml.NVML_FI_DEV_POWER_AVERAGE},
    "nvmlDeviceGetEnforcedPowerLimit": {pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT},
    "nvmlDeviceGetPcieReplayCounter": {pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER},
    "nvmlDeviceGetPcieThroughput": {pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES},
    "nvmlDeviceGetTotalEccErrors": {pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL},
    "nvmlDeviceGetRemappedRows": {pynvml.NVML_FI_DEV_REMAPPED_COR, pynvml.NVML_FI_DEV_REMAPPED_UNC,
                                  pynvml.NVML_FI_DEV_REMAPPED_PENDING, pynvml.NVML_FI_DEV_REMAPPED_FAILURE},
    "nvmlDeviceGetRetiredPages": {pynvml.NVML_FI_DEV_RETIRED_SBE, pynvml.NVML_FI_DEV_RETIRED_DBE},
    "nvmlDeviceGetRetiredPagesPendingStatus": {pynvml.NVML_FI_DEV_RETIRED_PENDING},
    "nvmlDeviceGetNvLinkState": {pynvml.NVML_FI_DEV_NVLINK_GET_STATE, pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT},
    "nvmlDeviceGetNvLinkErrorCounter": {
        pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL},
}
FIELD_BACKED = ["energy.consumed", "power.usage", "power.limit", "pcie.replay_errors", "ecc.errors.corrected",
                "ecc.errors.uncorrected", "remapped_rows.correctable", "remapped_rows.uncorrectable",
                "remapped_rows.pending", "remapped_rows.failed", "nvlink.links.active", "nvlink.errors.crc_flit",
                "nvlink.errors.crc_data", "nvlink.errors.replay", "nvlink.errors.recovery"]


def variant(directory, scenario, refused):
    """`scenario` with these refused fields, under its own file name: GPU UUIDs come from the name."""
    raw = yaml.safe_load(resolve(scenario).read_text())
    raw["refused_fields"] = list(refused)
    directory.mkdir()
    path = directory / f"{scenario}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def submitted():
    return {
        (name, tuple(sorted(stub.tags))): stub.value
        for name in aggregator.metric_names if name.startswith(NAMESPACE)
        for stub in aggregator.metrics(name)
    }


def link_of(tags):
    """The NVLink port a series is of; None for a GPU's own."""
    return next((tag for tag in tags if tag.startswith("nvlink_port:")), None)


def refused_ids(simulated):
    return {field_id for _, field_id in simulated.sim.field_refusals}


def every_run(simulated, runs):
    """What each of `runs` runs submitted, the first at t=1 (scenario time ran at wall speed until
    the fixture stopped it: this puts two nodes at the same instants)."""
    simulated.sim.advance(1 - simulated.now)
    found = []
    for _ in range(runs):
        simulated.run()
        found.append(submitted())
    # pynvml talks to the library of the last session started in the process: one node at a time.
    simulated.check.cancel()
    return found


@pytest.mark.parametrize("scenario", ["dgx-h100", "h100-no-fields"])
def test_a_driver_refusing_the_fields_gives_the_same_metrics(node, tmp_path, scenario):
    # Every 15 s up to t=91: past h100-no-fields' ECC errors, NVLink outage and pending remap.
    answering = node(variant(tmp_path / "answering", scenario, []))
    expected = every_run(answering, 7)
    refusing = node(variant(tmp_path / "refusing", scenario, REFUSED_NAMES))
    for run, found in enumerate(every_run(refusing, 7)):
        assert found == expected[run], f"run {run}"
    for metric in FIELD_BACKED:
        gpu_series = [tags for name, tags in expected[-1] if name == NAMESPACE + metric and not link_of(tags)]
        assert len(gpu_series) == len(refusing.sim.devices), metric
    assert refused_ids(refusing) >= REFUSED
    assert refusing.sim.calls["nvmlDeviceGetNvLinkErrorCounter"] > 0
    assert answering.sim.calls["nvmlDeviceGetNvLinkErrorCounter"] == 0
    assert refusing.sim.failures == answering.sim.failures == []


def test_the_fallbacks_see_the_faults(node):
    scenario = node("h100-no-fields").run_until(60)
    assert scenario.values("ecc.errors.corrected") == {0: 41 + 3, 1: 41}
    assert scenario.values("nvlink.links.active") == {0: 18, 1: 17}
    assert scenario.values("remapped_rows.pending") == {0: 0, 1: 1}
    assert scenario.values("remapped_rows.uncorrectable") == {0: 1, 1: 2}
    # The NVLink totals are the per-link counters summed: 37 before, one more for the outage on GPU 1.
    assert scenario.values("nvlink.errors.crc_flit") == {0: 37, 1: 38}
    assert scenario.values("power.limit") == {0: 700, 1: 700}


@pytest.mark.parametrize("scenario", ["dgx-h100", "h100-no-fields", "legacy-driver", "t4-shared", "a100-mig"])
def test_sources_are_learnt_once(node, scenario):
    simulated = node(scenario).run()
    refused_at_first = set(simulated.sim.field_refusals)
    fallen_back = refused_ids(simulated)
    simulated.sim.calls.clear()
    simulated.sim.field_requests.clear()
    simulated.sim.field_refusals.clear()
    simulated.run(2)
    # No field a device refused is asked of it again...
    assert not simulated.sim.field_refusals
    assert not set(simulated.sim.field_requests) & refused_at_first
    # ...and no fallback is called for a value the batch answered.
    for function, field_ids in FALLBACK_FOR.items():
        if simulated.sim.calls[function]:
            assert field_ids & fallen_back, function


def test_fallbacks_refused_too_are_not_called_again(node):
    # H100s retire no pages: the fields are refused (the feature), then the functions, once each.
    dgx = node("h100-no-fields").run()
    assert dgx.sim.calls["nvmlDeviceGetRetiredPages"] == 2 * 2  # both causes on both GPUs
    assert dgx.sim.calls["nvmlDeviceGetRetiredPagesPendingStatus"] == 2
    # The link count: 18 links answer nvmlDeviceGetNvLinkState and the 19th does not, once per GPU.
    states_at_first = dgx.sim.calls["nvmlDeviceGetNvLinkState"]
    assert states_at_first == 2 * (18 + 1) + 2 * 18
    dgx.sim.calls.clear()
    dgx.run(2)
    later = dgx.sim.calls
    assert later["nvmlDeviceGetRetiredPages"] == later["nvmlDeviceGetRetiredPagesPendingStatus"] == 0
    # Per run and GPU: each link's state, 4 error counters on each link, the other values once.
    assert later["nvmlDeviceGetNvLinkState"] == 2 * 2 * 18
    assert later["nvmlDeviceGetNvLinkErrorCounter"] == 2 * 2 * 18 * 4
    assert later["nvmlDeviceGetTotalEccErrors"] == 2 * 2 * 2
    for function in ("nvmlDeviceGetRemappedRows", "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetPowerUsage",
                     "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTotalEnergyConsumption"):
        assert later[function] == 2 * 2, function
    assert later["nvmlDeviceGetFieldValues"] == 2 * 2


def test_power_fields_follow_the_architecture(node):
    # The 1-s average field is Ampere-but-GA100 and later; the A100s and the old driver read the function.
    assert node("dgx-h100").run(2).sim.calls["nvmlDeviceGetPowerUsage"] == 0
    for scenario in ("a100-mig", "legacy-driver", "t4-shared"):
        simulated = node(scenario).run(2)
        physical = len(simulated.sim.devices)
        assert simulated.sim.calls["nvmlDeviceGetPowerUsage"] == 2 * physical, scenario
        assert len(simulated.values("power.usage")) == physical, scenario
    # Driver 470 predates the power fields: the limit comes from its function too.
    assert node("legacy-driver").run(2).sim.calls["nvmlDeviceGetEnforcedPowerLimit"] == 2 * 2
