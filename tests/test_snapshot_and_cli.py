"""The Snapshot as JSON (sidecar mode) and the `gpu-monitoring` command line."""

import csv
import io
import json
import os
from pathlib import Path

import pytest

from gpu_monitoring import __version__, simulator
from gpu_monitoring.cli.main import CRITICAL_FOUND, main
from gpu_monitoring.collectors.node_reader import NodeReader
from gpu_monitoring.metrics import spec as metric_spec
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.sidecar.protocol import DEFAULT_SOCKET
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import load as load_scenario
from gpu_monitoring.snapshot import Snapshot

from .conftest import tag_dict
from .sidecar_support import SidecarProcess

ROOT = Path(__file__).resolve().parents[1]


def collect(scenario, runs):
    """The snapshots of `runs` collections, 15 s of scenario time apart."""
    sim = SimulatedNvml(load_scenario(scenario), SimClock(speed=0))
    reader = NodeReader(NvmlSession(sim.library))
    snapshots = []
    try:
        for run in range(runs):
            if run:
                sim.advance(15)
            snapshots.append(reader.read())
    finally:
        reader.close()
    return snapshots


def run_cli(capsys, *args, code=0):
    """`check`'s output; it exits `code` (CRITICAL_FOUND where a service check of the last run is CRITICAL)."""
    exited = main(["check", *args])
    out = capsys.readouterr().out
    assert exited == code
    return out


# --- snapshot ----------------------------------------------------------------------------


def test_snapshot_round_trip():
    first, second = collect("dgx-h100", 2)
    for snapshot in (first, second):
        text = snapshot.to_json()
        back = Snapshot.from_json(text)
        assert back == snapshot
        assert back.to_json() == text
    assert len(second.devices) == 8
    assert second.node.driver_version == "550.90.07"
    assert second.devices[0].metrics["memory.total"] == 81559 * 1024 * 1024
    # GPM values only exist from the second collection on, and survive the trip.
    assert "sm_active" not in first.devices[0].metrics
    assert Snapshot.from_json(second.to_json()).devices[0].metrics["sm_active"] > 0
    assert [p.pid for p in Snapshot.from_json(second.to_json()).devices[3].processes] == [60211, 60388]


def test_snapshot_round_trip_with_mig_instances():
    (snapshot,) = collect("a100-mig", 1)
    back = Snapshot.from_json(snapshot.to_json())
    assert back == snapshot
    instances = back.devices[1].mig_instances
    assert [i.gpu_instance_id for i in instances] == [7, 8, 9, 10, 11, 12, 13]
    assert {i.profile for i in instances} == {"1g.10gb"}
    assert instances[0].processes[0].pid == 4201
    assert instances[0].processes[0].gpu_instance_id == 7


def test_snapshot_round_trip_with_events_and_a_lost_gpu():
    snapshot = collect("faults", 3)[-1]
    back = Snapshot.from_json(snapshot.to_json())
    assert back == snapshot
    assert back.devices[2].lost is True and "lost" in back.devices[2].error.lower()
    assert back.devices[2].metrics == {}
    assert sorted((e.kind, e.code) for e in back.events) == [("ecc_dbe", 0), ("xid", 13), ("xid", 63), ("xid", 79)]
    by_code = {e.code: e for e in back.events if e.kind == "xid"}
    assert by_code[79].device_uuid == back.devices[2].uuid


def test_snapshot_of_another_version_is_refused():
    (snapshot,) = collect("t4-shared", 1)
    raw = json.loads(snapshot.to_json())
    raw["version"] = 99
    with pytest.raises(ValueError, match="version"):
        Snapshot.from_json(json.dumps(raw))


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_a_snapshot_with_a_reading_json_cannot_hold_is_refused(number):
    (snapshot,) = collect("t4-shared", 1)
    text = snapshot.to_json().replace('"temperature": ', f'"temperature": {number}, "was": ', 1)
    with pytest.raises(ValueError, match=r"devices\[0\]\.metrics\['temperature'\] is .*, not a finite number"):
        Snapshot.from_json(text)


# --- command line ------------------------------------------------------------------------


def test_cli_json(capsys):
    report = json.loads(run_cli(capsys, "--simulate", "dgx-h100", "--json"))
    assert set(report) == {"summary", "metrics", "service_checks", "events", "changes", "runs", "interval",
                           "timeline_end", "whole_timeline_runs", "xids", "activity_by_run"}
    # Run 1 has taken GPM's first sample and no more: utilization judges its GPUs, GPM the next run's.
    assert [(run["run"], run["activity_sources"], run["counters_restarted"]) for run in report["activity_by_run"]] == [
        (1, {"utilization": 8}, []), (2, {"gpm": 8}, [])]
    assert report["runs"] == [{"run": 1, "at": pytest.approx(0, abs=5)}, {"run": 2, "at": pytest.approx(15, abs=5)}]
    for metric in report["metrics"]:
        assert set(metric) == {"name", "type", "value", "tags"}
        assert metric["name"].startswith("gpu_monitoring.")
        assert metric["type"] in {"gauge", "monotonic_count", "count"}
        assert metric["tags"] == sorted(metric["tags"])
    for check in report["service_checks"]:
        assert set(check) == {"name", "status", "tags", "message"}
    assert report["events"] == []
    health = {tag_dict(c["tags"])["gpu_index"]: (c["status"], c["message"]) for c in report["service_checks"]
              if c["name"] == "gpu_monitoring.device.health"}
    # Every GPU is OK but GPU 7, where the process of a pod that failed still holds memory.
    assert {index for index, (status, _) in health.items() if status != "OK"} == {"7"}
    assert health["7"][0] == "WARNING" and "pid 90114" in health["7"][1]
    statuses = {(c["name"], c["status"]) for c in report["service_checks"]}
    # dgx-h100 runs pods: its simulated kubelet and pod-resources socket answer.
    assert statuses == {
        ("gpu_monitoring.device.health", "OK"),
        ("gpu_monitoring.device.health", "WARNING"),
        ("gpu_monitoring.nvml.can_connect", "OK"),
        ("gpu_monitoring.kubelet.can_connect", "OK"),
        ("gpu_monitoring.node.health", "OK"),
    }
    assert len(report["service_checks"]) == 11
    count = [m for m in report["metrics"] if m["name"] == "gpu_monitoring.devices.count"]
    assert [m["value"] for m in count] == [8]
    temperatures = [m for m in report["metrics"] if m["name"] == "gpu_monitoring.temperature"]
    assert len(temperatures) == 8 and all(m["type"] == "gauge" for m in temperatures)
    # The exclusive GPUs' series carry their pod; GPU 7, given to no pod, carries none.
    pods = {tag_dict(m["tags"])["gpu_index"]: tag_dict(m["tags"]).get("pod_name") for m in temperatures}
    assert pods["0"] == pods["1"] == "llm-pretrain-0"
    assert pods["5"] == "jupyter-bob"
    assert pods["7"] is None
    funnel = {m["name"].rsplit(".", 1)[-1]: m["value"] for m in report["metrics"]
              if m["name"].startswith("gpu_monitoring.fleet.devices.")}
    assert funnel["total"] == 8 and funnel["allocated"] == 7 and funnel["active"] == 6


def test_cli_shows_monotonic_counts_as_the_increase(capsys):
    report = json.loads(run_cli(capsys, "--simulate", "dgx-h100", "--json"))
    energy = {tag_dict(m["tags"])["gpu_index"]: m for m in report["metrics"]
              if m["name"] == "gpu_monitoring.energy.consumed"}
    assert len(energy) == 8
    for metric in energy.values():
        assert metric["type"] == "monotonic_count"
        # One 15 s interval of an H100 drawing between its idle 72 W and its 700 W limit,
        # not the 520 MJ the counter holds since the driver loaded.
        assert 0 < metric["value"] < 520e6 / 1000
        assert 72 * 15 * 0.9 <= metric["value"] <= 700 * 15 * 1.1
    replays = [m for m in report["metrics"] if m["name"] == "gpu_monitoring.pcie.replay_errors"]
    assert [m["value"] for m in replays] == [0] * 8


def test_cli_single_run_has_no_increase_to_show(capsys):
    report = json.loads(run_cli(capsys, "--simulate", "dgx-h100", "--json", "--runs", "1"))
    assert [m for m in report["metrics"] if m["type"] == "monotonic_count"] == []
    assert any(m["name"] == "gpu_monitoring.temperature" for m in report["metrics"])


def test_cli_faults_show_xids(capsys):
    # The faults start 20 s into the scenario: the runs go on until they have happened.
    report = json.loads(run_cli(capsys, "--simulate", "faults", "--json", code=CRITICAL_FOUND))
    events = {tag_dict(e["tags"])["xid"]: e for e in report["events"]}
    assert set(events) == {"13", "63", "79"}
    assert events["79"]["alert_type"] == "error"
    assert events["79"]["title"].startswith("XID 79 on GPU 2")
    assert "What to do" in events["79"]["text"]
    health = {tag_dict(c["tags"]).get("gpu_index"): c for c in report["service_checks"]
              if c["name"] == "gpu_monitoring.device.health"}
    assert health["2"]["status"] == "CRITICAL"
    assert health["1"]["status"] == "WARNING"
    assert health["0"]["status"] == "OK"
    xids = {tag_dict(m["tags"])["xid"]: m for m in report["metrics"] if m["name"] == "gpu_monitoring.xid_errors"}
    assert {code: m["value"] for code, m in xids.items()} == {"13": 1, "63": 1, "79": 1}
    assert tag_dict(xids["79"]["tags"])["xid_action"] == "reboot_node"


def test_cli_table(capsys):
    out = run_cli(capsys, "--simulate", "faults", "--series", code=CRITICAL_FOUND)
    assert out.startswith("=== GPUs (6) ===")
    summary, series = out.split("=== Series sent to Datadog: ")
    assert "=== Service checks not OK (5 of 8) ===" in summary
    assert "=== Events (3) ===" in summary
    assert series.startswith(f"{series.split()[0]} metrics, 8 service checks, 3 events of 3 runs ===")
    assert "--- Service checks (8) ---" in series and "--- Events (3 of 3 runs) ---" in series
    assert "[error] XID 79 on GPU 2" in summary and "[error] run 3: XID 79 on GPU 2" in series
    assert "CRITICAL" in summary


def test_cli_runs_asked_for_win(capsys):
    # Two runs end at t=15, before the faults.
    report = json.loads(run_cli(capsys, "--simulate", "faults", "--runs", "2", "--json"))
    assert report["events"] == []


def test_cli_with_the_example_config(capsys):
    report = json.loads(run_cli(capsys, "--config", str(ROOT / "conf.yaml.example"), "--simulate", "t4-shared",
                                "--json"))
    health = [c for c in report["service_checks"] if c["name"] == "gpu_monitoring.device.health"]
    assert [c["status"] for c in health] == ["OK", "OK"]
    counts = {tag_dict(m["tags"])["gpu_index"]: m["value"] for m in report["metrics"]
              if m["name"] == "gpu_monitoring.processes.count"}
    # GPU 1 runs the MPS server (in the device plugin's control-daemon pod) and three MPS clients.
    assert counts == {"0": 3, "1": 4}
    kubelet = [c for c in report["service_checks"] if c["name"] == "gpu_monitoring.kubelet.can_connect"]
    assert [c["status"] for c in kubelet] == ["OK"]


def test_cli_config_interval_and_tags(capsys, tmp_path):
    config = tmp_path / "conf.yaml"
    config.write_text(
        "init_config: {}\n"
        "instances:\n"
        "  - {simulate: faults, min_collection_interval: 30, tags: [team:ml]}\n"
    )
    # Two runs 30 s apart reach t=30, past the faults at t=20.
    report = json.loads(run_cli(capsys, "--config", str(config), "--json", code=CRITICAL_FOUND))
    assert {tag_dict(e["tags"])["xid"] for e in report["events"]} == {"13", "63", "79"}
    for item in report["metrics"] + report["service_checks"] + report["events"]:
        assert "team:ml" in item["tags"]


USAGE_ERRORS = {
    "zero runs": (["--simulate", "dgx-h100", "--runs", "0"], "--runs"),
    "a socket read locally": (["--source", "local", "--socket", "/tmp/x.sock"], "--socket"),
}


@pytest.mark.parametrize("args, named", USAGE_ERRORS.values(), ids=USAGE_ERRORS.keys())
def test_cli_usage_errors(capsys, args, named):
    with pytest.raises(SystemExit) as exit_:
        main(["check", *args])
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err


BAD_CONFIGS = {
    "a list": (b"- init_config\n- instances\n", "must be a mapping"),
    "a scalar": (b"42\n", "must be a mapping"),
    "a null instance": (b"instances:\n  -\n", "`instances` item 0"),
    "a scalar instance": (b"instances: [{}, local]\n", "`instances` item 1"),
    "instances not a list": (b"instances: {source: local}\n", "`instances`"),
    "init_config not a mapping": (b"init_config: [1]\ninstances: [{}]\n", "`init_config`"),
    "not YAML": (b"instances: [\n", "cannot read"),
    "binary": (b"\xff\xfe\x00binary", "cannot read"),
    "a wrong option": (b"instances: [{simulate: t4-shared, temperature_margin: .nan}]\n", "`temperature_margin`"),
}


@pytest.mark.parametrize("content, reason", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_cli_config_that_is_wrong_is_one_line_and_exit_2(capsys, tmp_path, content, reason):
    config = tmp_path / "conf.yaml"
    config.write_bytes(content)
    assert main(["check", "--config", str(config)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("gpu-monitoring check: ") and captured.err.count("\n") == 1
    assert reason in captured.err


def test_cli_config_that_is_missing_or_a_wrong_scenario_is_one_line_and_exit_2(capsys, tmp_path):
    assert main(["check", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert main(["check", "--simulate", "no-such-scenario"]) == 2
    err = capsys.readouterr().err
    assert "`simulate`" in err and err.count("\n") == 1


def test_cli_metadata(capsys):
    assert main(["metadata"]) == 0
    out = capsys.readouterr().out
    assert out == metric_spec.metadata_csv()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == len(metric_spec.SPEC)


def test_cli_takes_generic_tags_as_the_agent_does(capsys, tmp_path):
    config = tmp_path / "conf.yaml"
    config.write_text("instances:\n  - {simulate: t4-shared, tags: [env:lab, service:x, version:1]}\n")
    report = json.loads(run_cli(capsys, "--config", str(config), "--json"))
    assert report["metrics"] and report["service_checks"]
    for item in report["metrics"] + report["service_checks"]:
        assert {"env:lab", "service:x", "version:1"} <= set(item["tags"]), item
    # The test aggregator's own rule is back for the tests that follow.
    assert "DDEV_SKIP_GENERIC_TAGS_CHECK" not in os.environ


def test_cli_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"gpu-monitoring {__version__}\n"


@pytest.mark.parametrize("command", ["check", "status"])
def test_cli_help_lists_every_scenario_and_default(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    shipped = sorted(path.stem for path in (Path(simulator.__file__).parent / "scenarios").glob("*.yaml"))
    assert shipped
    listed = out.split("scenarios for --simulate:")[1].split("\n\n")[0]
    assert sorted(name.strip() for name in listed.split(",")) == shipped
    options = out.split("options:")[1].split("scenarios for --simulate:")[0]
    help_texts = options.split("\n  --")[1:]
    assert len(help_texts) == (8 if command == "check" else 7)
    assert all("default:" in text for text in help_texts), help_texts
    assert DEFAULT_SOCKET in out and "GRPC_VERBOSITY" in out


def test_cli_reads_a_sidecar_socket(capsys, tmp_path):
    sidecar = SidecarProcess(tmp_path, "legacy-driver").start()
    try:
        report = json.loads(run_cli(capsys, "--source", "sidecar", "--socket", sidecar.socket, "--json"))
    finally:
        sidecar.stop()
    statuses = {c["name"]: c["status"] for c in report["service_checks"]}
    assert statuses["gpu_monitoring.sidecar.can_connect"] == "OK"
    assert statuses["gpu_monitoring.device.health"] == "OK"
    assert any(m["name"] == "gpu_monitoring.temperature" for m in report["metrics"])


def test_cli_socket_without_source_reads_the_sidecar(capsys, tmp_path):
    report = json.loads(run_cli(capsys, "--socket", str(tmp_path / "absent.sock"), "--json", "--runs", "1",
                                code=CRITICAL_FOUND))
    (check,) = report["service_checks"]
    assert (check["name"], check["status"]) == ("gpu_monitoring.sidecar.can_connect", "CRITICAL")
    assert "absent.sock" in check["message"]
