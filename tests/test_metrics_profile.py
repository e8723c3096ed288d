"""metrics_profile on every scenario of the package: the series per GPU each profile sends, what
stays the same in every profile, and the README's "Metric volume" table that comes from the count."""

import re
from pathlib import Path

import pytest
from datadog_checks.base.stubs import aggregator

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.metrics.names import CLOCK_SM, MEMORY_BAR1_USED, NVLINK_THROUGHPUT_TX, UTILIZATION_GPU
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.metrics.spec import NAMESPACE, PROFILES, sent_in
from gpu_monitoring.simulator.scenario import available

from .scripts_support import load_script
from .test_config_spec import spec_options

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TABLE = re.compile(r"<!-- metric-volume:start -->\n(.*?)<!-- metric-volume:end -->", re.S)
# Series per GPU on a DGX H100 with its pods: what the profiles promise.
DGX_H100_BOUNDS = {"essential": 25, "standard": 60}


metric_volume = load_script("metric_volume")


@pytest.fixture(scope="module")
def measured():
    return metric_volume.volumes()


def test_every_scenario_of_the_package_is_counted(measured):
    assert list(measured) == available()
    assert all(list(by_profile) == list(PROFILES) for by_profile in measured.values())


def test_dgx_h100_stays_within_each_profiles_bound(measured):
    for profile, bound in DGX_H100_BOUNDS.items():
        assert measured["dgx-h100"][profile].per_gpu <= bound, profile


def test_each_profile_sends_what_the_smaller_one_sends_and_no_metric_beyond_its_own(measured):
    for scenario, by_profile in measured.items():
        for smaller, larger in zip(PROFILES, PROFILES[1:]):
            assert by_profile[smaller].series <= by_profile[larger].series, (scenario, smaller, larger)
        for profile, volume in by_profile.items():
            names = {name[len(NAMESPACE) + 1:] for name, _ in volume.series}
            assert names <= sent_in(profile), (scenario, profile, sorted(names - sent_in(profile)))
    # Only the largest sends per-process series.
    full = {name for name, _ in measured["dgx-h100"]["full"].series}
    standard = {name for name, _ in measured["dgx-h100"]["standard"].series}
    assert f"{NAMESPACE}.process.memory.used" in full - standard


def test_health_service_checks_and_events_are_the_same_in_every_profile(measured):
    for scenario, by_profile in measured.items():
        for profile in PROFILES[1:]:
            assert by_profile[profile].service_checks == by_profile[PROFILES[0]].service_checks, (scenario, profile)
            assert by_profile[profile].events == by_profile[PROFILES[0]].events, (scenario, profile)


def test_faults_have_the_same_health_and_events_in_every_profile():
    """At t=30 the faults scenario has its XIDs, a lost GPU and unhealthy GPUs: something to compare."""
    volumes = [metric_volume.measure("faults", profile, runs=3) for profile in PROFILES]
    assert volumes[0].events and any(status != 0 for _, status, _, _ in volumes[0].service_checks)
    for volume in volumes[1:]:
        assert volume.service_checks == volumes[0].service_checks
        assert volume.events == volumes[0].events


def test_metric_patterns_filter_on_top_of_the_profile():
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{
        "simulate": "dgx-h100", "metrics_profile": "essential",
        "metric_patterns": {"exclude": [r"gpu_monitoring\.temperature"]},
    }])
    try:
        aggregator.reset()
        assert check.run() == ""
        sent = {name[len(NAMESPACE) + 1:] for name in aggregator.metric_names}
    finally:
        check.cancel()
        aggregator.reset()
    assert "utilization.gpu" in sent and "clock.sm" not in sent
    assert not any(name.startswith("temperature") for name in sent)


def test_the_spec_states_the_series_per_gpu_of_dgx_h100(measured):
    description = spec_options()["metrics_profile"]["description"]
    stated = [int(number) for number in re.findall(r"(\d+) series per GPU\.", description)]
    assert stated == [round(measured["dgx-h100"][profile].per_gpu) for profile in PROFILES]


def test_the_table_has_a_row_per_scenario_and_a_column_per_profile(measured):
    lines = metric_volume.table(measured).splitlines()
    assert lines[0] == ("| scenario | GPUs | `essential` | `standard` | `full` "
                        "| port series per node (essential / standard / full) |")
    assert len(lines) == 2 + len(measured)
    row = next(line for line in lines if line.startswith("| `dgx-h100` |"))
    dgx = measured["dgx-h100"]
    assert row == (f"| `dgx-h100` | 8 | {dgx['essential'].per_gpu:.1f} | {dgx['standard'].per_gpu:.1f} "
                   f"| {dgx['full'].per_gpu:.1f} | {dgx['essential'].port_series} / {dgx['standard'].port_series} "
                   f"/ {dgx['full'].port_series} |")


def test_readme_shows_the_counted_table(measured):
    found = TABLE.search(README.read_text())
    assert found, "README.md has no <!-- metric-volume:start --> ... <!-- metric-volume:end --> table"
    assert found[1].strip() == metric_volume.table(measured).strip(), (
        "README.md's metric volume table is stale: paste the output of `python scripts/metric_volume.py`"
    )


# --- the profile, decided once ----------------------------------------------------------------------


def test_a_profile_sends_its_metrics_and_larger_ones_send_more():
    essential, standard, full = (Profile(name) for name in PROFILES)
    assert essential.sends(UTILIZATION_GPU) and not essential.sends(CLOCK_SM)
    assert standard.sends(CLOCK_SM) and not standard.sends(MEMORY_BAR1_USED) and full.sends(MEMORY_BAR1_USED)
    # A GPU's NVLink throughput in standard, each link's in full only.
    assert standard.sends(NVLINK_THROUGHPUT_TX) and not standard.sends_part(NVLINK_THROUGHPUT_TX)
    assert full.sends_part(NVLINK_THROUGHPUT_TX)
    assert Profile() == standard and EVERYTHING == full and len({essential, standard, full}) == 3


def test_an_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="unknown metrics_profile 'tiny': one of essential, standard, full"):
        Profile("tiny")


# Reads that give only metrics essential does not send, and what they give.
NOT_READ_IN_ESSENTIAL = {
    "nvmlDeviceGetBAR1MemoryInfo": "memory.bar1.*",
    "nvmlDeviceGetEncoderUtilization": "utilization.encoder",
    "nvmlDeviceGetClockInfo": "clock.*",
    "nvmlDeviceGetPerformanceState": "performance_state",
    "nvmlDeviceGetPersistenceMode": "device.persistence_mode",
}


@pytest.mark.parametrize("profile", ["essential", "full"])
def test_collection_consults_the_profile_submission_sends_by(node, profile):
    simulated = node("dgx-h100", metrics_profile=profile).run(2)
    profile_of = simulated.check.submitter.profile
    assert profile_of == Profile(profile)
    assert {collector.profile for collector in simulated.check.source.reader.collectors} == {profile_of}
    made = {function for function in NOT_READ_IN_ESSENTIAL if simulated.sim.calls[function]}
    assert made == (set() if profile == "essential" else set(NOT_READ_IN_ESSENTIAL))
