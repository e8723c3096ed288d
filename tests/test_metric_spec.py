"""The metric spec (metrics.yaml) against metadata.csv and against what the scenarios really submit."""

import csv
from collections import defaultdict
from pathlib import Path

import pytest
from datadog_checks.base.stubs import aggregator as stub_aggregator

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.metrics import spec as metric_spec
from gpu_monitoring.metrics.spec import SPEC

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "gpu_monitoring."
SUBMISSION_TYPES = {
    "gauge": stub_aggregator.GAUGE,
    "monotonic_count": stub_aggregator.MONOTONIC_COUNT,
    "count": stub_aggregator.COUNT,
}
# Scenario, how long to run it and the instance options: faults until t=60 sees the XIDs and the link
# faults; prices make the cost metrics appear, and a cap of 2 processes per device leaves t4-shared's
# MPS GPU (4 processes) with processes.omitted.
SCENARIOS = {
    "dgx-h100": (15, {"hourly_price": {"NVIDIA H100*": 4.0}}),
    "a100-mig": (15, {"hourly_price": {"NVIDIA A100-SXM4-80GB": 3.0}}),
    "t4-shared": (15, {"default_hourly_price": 0.35, "max_processes_per_device": 2}),
    "legacy-driver": (15, {}),
    "faults": (105, {}),  # its last PCIe AER error (non-fatal) comes at t=100
    "hgx-b200": (15, {}),
    "gh200": (30, {}),
    "gpu-missing": (15, {}),
}
# Every metric the spec names: what the largest profile sends.
FULL = {"metrics_profile": "full"}


@pytest.fixture(scope="module")
def submitted():
    """{metric name: {scenario: {submission types}}} over every run of every scenario."""
    found = defaultdict(lambda: defaultdict(set))
    for scenario, (until, options) in SCENARIOS.items():
        check = GpuMonitoringCheck("gpu_monitoring", {}, [dict(options, simulate=scenario, **FULL)])
        check.simulated_node.nvml.clock.set_speed(0)
        for run in range(until // 15 + 1):
            if run:
                check.simulated_node.nvml.advance(15)
            stub_aggregator.reset()
            assert check.run() == ""
            for name in stub_aggregator.metric_names:
                assert name.startswith(NAMESPACE), name
                for stub in stub_aggregator.metrics(name):
                    found[name[len(NAMESPACE):]][scenario].add(stub.type)
        check.cancel()
    stub_aggregator.reset()
    return found


def test_metadata_csv_is_up_to_date():
    committed = (ROOT / "metadata.csv").read_text()
    assert committed == metric_spec.metadata_csv(), (
        "metadata.csv is stale: it no longer matches gpu_monitoring/metrics/metrics.yaml; run `make metadata`"
    )


def test_metadata_csv_rows():
    with open(ROOT / "metadata.csv") as f:
        rows = {row["metric_name"]: row for row in csv.DictReader(f)}
    assert set(rows) == {NAMESPACE + name for name in SPEC}
    for name, metric in SPEC.items():
        row = rows[NAMESPACE + name]
        # Datadog stores monotonic counts as counts.
        assert row["metric_type"] == {"gauge": "gauge", "monotonic_count": "count", "count": "count"}[metric.type]
        assert row["unit_name"] == metric.unit
        assert row["integration"] == "gpu_monitoring"
        assert row["description"]


def test_spec_types():
    for name, metric in SPEC.items():
        assert metric.type in SUBMISSION_TYPES, name
        assert metric.full_name == NAMESPACE + name
    # Cumulative hardware counters are monotonic counts, XIDs a count of events per run.
    for name in ("energy.consumed", "pcie.replay_errors", "ecc.errors.corrected", "ecc.errors.uncorrected",
                 "nvlink.errors.crc_flit", "nvlink.errors.crc_data", "nvlink.errors.replay",
                 "nvlink.errors.recovery"):
        assert SPEC[name].type == "monotonic_count", name
    assert SPEC["xid_errors"].type == "count"
    assert SPEC["temperature"].type == "gauge"


def test_every_metric_names_its_profile_and_the_profiles_nest():
    for name, metric in SPEC.items():
        assert metric.profile in metric_spec.PROFILES, name
    sent = [metric_spec.sent_in(profile) for profile in metric_spec.PROFILES]
    assert all(smaller < larger for smaller, larger in zip(sent, sent[1:]))
    assert sent[-1] == set(SPEC)
    # Per-process series come and go with every pid: only the largest profile sends them.
    assert {name for name in SPEC if name.startswith("process.")} <= sent[-1] - sent[-2]


def test_metadata_says_which_profiles_send_a_metric():
    with open(ROOT / "metadata.csv") as f:
        rows = {row["metric_name"]: row for row in csv.DictReader(f)}
    assert rows[NAMESPACE + "utilization.gpu"]["description"].endswith("(sent in every metrics_profile)")
    assert rows[NAMESPACE + "clock.sm"]["description"].endswith("(sent with metrics_profile standard or full)")
    assert rows[NAMESPACE + "process.memory.used"]["description"].endswith("(sent with metrics_profile full)")


def test_every_spec_metric_is_submitted_by_some_scenario(submitted):
    missing = sorted(set(SPEC) - set(submitted))
    assert missing == [], f"in metrics.yaml but no scenario submits them: {missing}"


@pytest.mark.parametrize(
    "metric, scenario",
    [
        ("utilization.encoder", "t4-shared"),
        ("fan.speed", "legacy-driver"),
        ("retired_pages.single_bit", "legacy-driver"),
        ("retired_pages.single_bit", "t4-shared"),
        ("xid_errors", "faults"),
        ("mig.instances", "a100-mig"),
        ("sm_active", "dgx-h100"),
        ("memory.reserved", "dgx-h100"),
        ("processes.omitted", "t4-shared"),
        ("cost.idle_hourly", "dgx-h100"),
        ("cost.hourly", "a100-mig"),
        ("workload.sm_limit", "t4-shared"),
        ("workload.cost.idle_hourly", "t4-shared"),
    ],
)
def test_where_the_rarer_metrics_come_from(submitted, metric, scenario):
    assert scenario in submitted[metric]


def test_every_submitted_metric_is_in_the_spec_with_its_type(submitted):
    for name, by_scenario in submitted.items():
        assert name in SPEC, f"{name} is submitted but not in metrics.yaml"
        for scenario, types in by_scenario.items():
            assert types == {SUBMISSION_TYPES[SPEC[name].type]}, (name, scenario, types)
