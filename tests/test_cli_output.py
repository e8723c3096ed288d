"""What `gpu-monitoring check` prints: the summary first, the series after it only when asked, values
in human units, workloads named by their pod or Slurm job, a scenario's faults, and no gRPC noise.

Expected values come from the scenario files, not from the code under test.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu_monitoring import simulator
from gpu_monitoring.cli.main import CRITICAL_FOUND, main
from gpu_monitoring.metrics.units import byte_size, human

from .conftest import tag_dict

SCENARIOS = Path(simulator.__file__).parent / "scenarios"
SERIES_HEADING = "=== Series sent to Datadog"
EXPONENT = re.compile(r"\d[eE][+-]?\d")
ROOT = Path(__file__).resolve().parents[1]


def scenario(name):
    return yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())


def check(capsys, *args, code=0):
    """`check`'s output; it exits `code` (CRITICAL_FOUND where a service check of the last run is CRITICAL)."""
    assert main(["check", *args]) == code
    return capsys.readouterr().out


def test_the_summary_comes_before_any_series(capsys):
    out = check(capsys, "--simulate", "dgx-h100", "--series")
    summary, series = out.split(SERIES_HEADING)
    assert summary.startswith("=== GPUs (8) ===")
    for heading in ("Node: ", "=== Service checks", "=== Events (0) ===", "=== Workload cost"):
        assert heading in summary
    assert not [line for line in summary.splitlines() if line.startswith("gpu_monitoring.")]
    assert series.count("\ngpu_monitoring.") > 100


def test_without_series_only_the_summary(capsys):
    out = check(capsys, "--simulate", "dgx-h100")
    assert SERIES_HEADING not in out and "gpu_monitoring.temperature" not in out


def test_values_are_in_human_units(capsys):
    raw = scenario("dgx-h100")
    memory_mib = raw["models"][raw["devices"][0]["model"]]["memory_mib"]
    out = check(capsys, "--simulate", "dgx-h100", "--series")
    # Values, not tags: a container ID or UUID may hold `4e7`.
    shown = " ".join(word for word in out.split() if ":" not in word)
    assert not EXPONENT.search(shown), EXPONENT.search(shown)
    lines = out.split(SERIES_HEADING)[1].splitlines()
    totals = [line for line in lines if line.startswith("gpu_monitoring.memory.total ")]
    assert len(totals) == len(raw["devices"])
    assert all(f" {memory_mib / 1024:.1f} GiB " in line for line in totals), totals
    for line in lines:
        if line.startswith(("gpu_monitoring.pcie.throughput.", "gpu_monitoring.nvlink.throughput.")):
            assert re.search(r" \d[\d.,]* (B|KiB|MiB|GiB)/s ", line), line
        if line.startswith("gpu_monitoring.utilization.gpu "):
            assert re.search(r" \d[\d.]*% ", line), line
    # The table's total is the series' own figure, in the same unit and precision.
    gpu_rows = [row for row in out.split("=== GPUs")[1].split("Node:")[0].splitlines()[2:] if row[:1].isdigit()]
    total = re.search(r" (\d[\d.]*) GiB ", totals[0]).group(1)
    assert gpu_rows and all(f"/{total} GiB" in row for row in gpu_rows), gpu_rows


@pytest.mark.parametrize("metric, value, shown", [
    ("gpu_monitoring.memory.used", 3 * 1024 ** 3, "3 GiB"),
    ("memory.total", 81559 * 1024 ** 2, "79.6 GiB"),
    ("pcie.throughput.tx", 1.5 * 1024 ** 2, "1.5 MiB/s"),
    ("utilization.gpu", 91.3, "91.3%"),
    ("power.usage", 582.4, "582 W"),
    ("cost.hourly", 3.5, "$3.50"),
    ("energy.consumed", 8616.0, "8,616 J"),
    ("no.such.metric", 1234567.0, "1,234,567"),
    ("utilization.gpu", None, "-"),
])
def test_human_units(metric, value, shown):
    assert human(metric, value) == shown


def test_byte_sizes():
    assert [byte_size(v) for v in (0, 1023, 1536, 2 ** 40)] == ["0 B", "1,023 B", "1.5 KiB", "1 TiB"]


def test_slurm_workloads_are_told_apart(capsys):
    jobs = {str(job["id"]): job["name"] for job in scenario("hpc-slurm")["slurm"]["jobs"]}
    out = check(capsys, "--simulate", "hpc-slurm", "--series")
    summary, series = out.split(SERIES_HEADING)
    holders = {row.split()[0]: row for row in summary.split("=== GPUs")[1].split("Node:")[0].splitlines()[2:]}
    named = {job for job in jobs if any(f"slurm job {job} ({jobs[job]})" in row for row in holders.values())}
    assert named == set(jobs)
    workloads = summary.split("=== Workload cost")[1].split("\n\n")[0].splitlines()[2:]
    assert sorted(row.split()[2] for row in workloads if row.strip()) == sorted(jobs)
    gpus_lines = [line for line in series.splitlines() if line.startswith("gpu_monitoring.workload.gpus ")]
    assert gpus_lines and all("slurm_job_id:" in line for line in gpus_lines)
    shown = {tag_dict(line.split()[-1].split(","))["slurm_job_id"] for line in gpus_lines}
    assert shown == set(jobs)
    assert len(set(gpus_lines)) == len(gpus_lines)


def test_pod_workloads_name_namespace_and_pod(capsys):
    # A finished pod holds nothing and costs nothing, though its process may linger.
    pods = {f"{pod['namespace']}/{pod['name']}" for pod in scenario("dgx-h100")["kubernetes"]["pods"]
            if pod.get("phase", "Running") == "Running"}
    out = check(capsys, "--simulate", "dgx-h100")
    workloads = out.split("=== Workload cost")[1].split("\n\n")[0].splitlines()[2:]
    assert {row.split()[0] for row in workloads if row.strip()} == pods


def test_faults_alone_show_their_faults(capsys):
    first = min(fault["at"] for fault in scenario("faults")["faults"])
    assert first > 15, "the default two runs would not reach the faults"
    out = check(capsys, "--simulate", "faults", code=CRITICAL_FOUND)
    problems = out.split("=== Service checks not OK")[1].split("\n\n")[0]
    rows = [row.split() for row in problems.splitlines()[1:] if row.strip()]
    assert {(row[0], row[1], row[3]) for row in rows} >= {("device.health", "CRITICAL", "2")}
    assert any("XID 79" in " ".join(row) for row in rows)
    events = out.split("=== Events")[1]
    # The most severe first.
    assert re.findall(r"^\[(?:error|warning|info)\] XID (\d+) on GPU", events, re.M) == ["79", "13", "63"]
    assert "What to do: " in events


def test_json_carries_the_summary(capsys):
    report = json.loads(check(capsys, "--simulate", "faults", "--json", code=CRITICAL_FOUND))
    summary = report["summary"]
    assert set(summary) == {"gpus", "funnel", "activity_sources", "gpm_restarting", "cost", "unusable", "workloads",
                            "idle_workloads", "service_checks_not_ok", "application_xids"}
    # The kernel's line named the process the application XID of t=20 hit (faults runs no pods: its name).
    assert {"workload": "process python3", "xid": "13", "gpu_index": "1", "count": 1} in summary["application_xids"]
    gpus = {row["gpu_index"]: row for row in summary["gpus"]}
    assert len(gpus) == len(scenario("faults")["devices"])
    assert gpus["2"]["health"] == "CRITICAL" and gpus["2"]["memory_used"] is None
    assert gpus["0"]["memory_total"] > 0 and gpus["0"]["utilization_gpu"] > 0
    assert summary["funnel"]["total"] == len(gpus) == sum(summary["activity_sources"].values())
    assert summary["cost"]["hourly"] == pytest.approx(sum(row["cost_hourly"] for row in gpus.values()))
    not_ok = summary["service_checks_not_ok"]
    assert not_ok and all(c["status"] != "OK" and c["message"] for c in not_ok)
    assert not_ok == [c for c in report["service_checks"] if c["status"] != "OK"]


def test_json_workloads(capsys):
    report = json.loads(check(capsys, "--simulate", "hpc-slurm", "--json"))
    workloads = {w["workload"]: w for w in report["summary"]["workloads"]}
    job = scenario("hpc-slurm")["slurm"]["jobs"][0]
    row = workloads[f"slurm job {job['id']} ({job['name']})"]
    assert row["gpus"] == len(job["processes"])


def test_a_metric_not_sent_shows_as_a_dash(capsys, tmp_path):
    config = tmp_path / "conf.yaml"
    dropped = ["utilization\\.gpu", "memory\\.", "fleet\\.", "cost\\.", "workload\\."]
    config.write_text(yaml.safe_dump({"instances": [{"metric_patterns": {"exclude": dropped}}]}))
    out = check(capsys, "--config", str(config), "--simulate", "dgx-h100")
    table = out.split("=== GPUs (8) ===")[1].split("Node:")[0].splitlines()
    # Every GPU is an H100: the device is said above the table, and utilization and memory come after the index.
    assert table[1] == "device of every GPU: nvidia_h100_80gb_hbm3"
    assert table[2].split()[:3] == ["gpu", "util", "memory"]
    rows = table[3:]
    assert len(rows) == 8 and all(row.split()[1:3] == ["-", "-"] for row in rows), rows
    assert "Node: - GPUs: - allocated, - active, - effective; no price" in out


def test_no_grpc_logging_unless_asked():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    command = [sys.executable, "-m", "gpu_monitoring.cli", "check", "--simulate", "dgx-h100"]
    quiet = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0, quiet.stderr
    assert "chttp2" not in quiet.stderr and "GOAWAY" not in quiet.stderr, quiet.stderr
    asked = subprocess.run(command, env=dict(env, GRPC_VERBOSITY="DEBUG"), cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert asked.returncode == 0
    assert re.search(r"^[IWE]\d{4} ", asked.stderr, re.M), asked.stderr


@pytest.mark.parametrize("name, source", [("dgx-h100", "gpm"), ("l4-dcgm", "dcgm"), ("a100-mig", "dcgm"),
                                          ("l4-mixed", "utilization")])
def test_the_node_line_says_what_activity_its_counts_rest_on(capsys, name, source):
    gpus = len(scenario(name)["devices"])
    node_line = next(line for line in check(capsys, "--simulate", name).splitlines() if line.startswith("Node:"))
    assert f"effective (activity: {source} {gpus});" in node_line
