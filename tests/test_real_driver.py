"""The simulated H100 against what a real one answered (tests/data/real, recorded on an H100
80GB HBM3, driver 580): every query the check makes, every field it batches and every fallback
function alike in status, value type and kind of answer (scripts/driver_report.py); and every
series the check sent there, sent by the simulated node too, of the same type and tag keys."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "real" / "h100-80gb-hbm3-driver-580.json"
SERIES = ROOT / "tests" / "data" / "real" / "h100-check-series.json"
REPORT = ROOT / "scripts" / "driver_report.py"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "dgx-h100.json"
    with out.open("w") as f:
        subprocess.run([sys.executable, str(REPORT), "--simulate", "dgx-h100", "--runs", "3"], stdout=f, check=True)
    return out


def differences(real: Path, simulated: Path):
    done = subprocess.run([sys.executable, str(REPORT), "--compare", str(real), str(simulated)],
                          capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_the_simulated_h100_answers_as_the_real_one(simulated):
    lines = differences(RECORDED, simulated)
    # The recorded H100 sat alone in a virtual machine: its NVLink answers NOT_SUPPORTED, where
    # dgx-h100's GPUs have 18 links each. Nothing else may differ.
    assert lines and all("nvlink" in line for line in lines), lines


def test_a_field_answered_in_another_width_is_a_difference(simulated, tmp_path):
    real = json.loads(RECORDED.read_text())
    real["gpus"][0]["fields"]["pcie_tx_bytes:0"]["type"] = "UNSIGNED_LONG_LONG"
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(real))
    lines = [line for line in differences(changed, simulated) if "nvlink" not in line]
    assert len(lines) == 1 and lines[0].startswith("field pcie_tx_bytes:0: SUCCESS UNSIGNED_LONG_LONG ")
    assert lines[0].split(" | ")[1].startswith("SUCCESS UNSIGNED_INT ")


def test_the_recorded_run_made_twenty_calls_for_its_gpu():
    # One GPU with processes on it: 20 calls for the GPU and the node's event drain.
    calls = json.loads(RECORDED.read_text())["check"]["calls_per_gpu"]
    assert sum(n for name, n in calls.items() if name != "nvmlEventSetWait_v2") == 20
    assert calls["nvmlDeviceGetProcessUtilization"] == 1


def test_every_series_the_real_h100_sent_the_simulated_node_sends(node, aggregator):
    # The real H100 was recorded sending every series it had: what metrics_profile full sends.
    node("dgx-h100", metrics_profile="full").run(3)
    simulated = {}
    for name in aggregator.metric_names:
        for stub in aggregator.metrics(name):
            kind = {aggregator.GAUGE: "gauge", aggregator.MONOTONIC_COUNT: "monotonic_count"}.get(stub.type)
            simulated.setdefault((name, kind), set()).update(tag.split(":", 1)[0] for tag in stub.tags)
    recorded = json.loads(SERIES.read_text())
    for name, kind, tag_keys in recorded["metrics"]:
        assert (name, kind) in simulated, (name, kind)
        assert set(tag_keys) <= simulated[(name, kind)], (name, set(tag_keys) - simulated[(name, kind)])
    assert {name for name, _ in recorded["service_checks"]} <= set(aggregator._service_checks)
