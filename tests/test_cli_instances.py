"""A --config with several instances: `check --json` prints one JSON document whose `instances` holds each
instance's report, the text names each instance in a header, and the exit status is the worst of theirs.
One instance prints what it always has, so that consumers of that document do not change."""

import json

import pytest

from gpu_monitoring.cli.main import CRITICAL_FOUND, main

HEADER = "=== Instance "


def config(tmp_path, *instances):
    path = tmp_path / "conf.yaml"
    path.write_text("instances:\n" + "".join(f"  - {instance}\n" for instance in instances))
    return str(path)


def run(capsys, *args, code=0):
    assert main(list(args)) == code
    return capsys.readouterr().out


def test_several_instances_print_one_json_document(capsys, tmp_path):
    two = config(tmp_path, "{simulate: t4-shared}", "{simulate: dgx-h100}")
    document = json.loads(run(capsys, "check", "--config", two, "--json"))
    assert list(document) == ["instances"]
    one = json.loads(run(capsys, "check", "--simulate", "t4-shared", "--json"))
    reports = document["instances"]
    assert [list(report) for report in reports] == [list(one), list(one)]
    # Each report is its own instance's: the simulated nodes have 2 and 8 GPUs.
    assert [len(report["summary"]["gpus"]) for report in reports] == [2, 8]


def test_several_instances_in_text_each_under_a_header(capsys, tmp_path):
    two = config(tmp_path, "{simulate: t4-shared}", "{simulate: dgx-h100}")
    out = run(capsys, "check", "--config", two)
    assert [line for line in out.splitlines() if line.startswith(HEADER)] == [
        "=== Instance 1 of 2: simulate t4-shared ===",
        "=== Instance 2 of 2: simulate dgx-h100 ===",
    ]
    first, second = out.split("\n\n=== Instance 2 of 2")
    assert first.splitlines()[1] == "=== GPUs (2) ==="
    assert second.splitlines()[1] == "=== GPUs (8) ==="


def test_status_names_each_instance_by_what_it_reads(capsys, tmp_path):
    three = config(tmp_path, "{simulate: t4-shared}", "{source: sidecar, sidecar_socket: /nonexistent/gpu.sock}",
                   "{source: local, simulate: dgx-h100}")
    out = run(capsys, "status", "--config", three, code=1)
    assert [line for line in out.splitlines() if line.startswith(HEADER)] == [
        "=== Instance 1 of 3: simulate t4-shared ===",
        "=== Instance 2 of 3: source sidecar /nonexistent/gpu.sock ===",
        "=== Instance 3 of 3: simulate dgx-h100 ===",
    ]
    assert out.count("\nStatus: ") == 3


@pytest.mark.parametrize("command", ["check", "status"])
@pytest.mark.parametrize("order", [("faults", "t4-shared"), ("t4-shared", "faults")], ids=["first", "last"])
def test_the_exit_status_is_the_worst_instance(capsys, tmp_path, command, order):
    # `faults` runs until its first fault, an XID that makes a GPU CRITICAL; t4-shared stays OK.
    two = config(tmp_path, *(f"{{simulate: {name}}}" for name in order))
    out = run(capsys, command, "--config", two, *(["--json"] if command == "check" else []), code=CRITICAL_FOUND)
    if command == "check":
        assert len(json.loads(out)["instances"]) == 2


@pytest.mark.parametrize("command", ["check", "status"])
def test_one_instance_prints_as_it_always_has(capsys, tmp_path, command):
    one = config(tmp_path, "{simulate: t4-shared}")
    out = run(capsys, command, "--config", one)
    assert HEADER not in out
    assert out.startswith("=== GPUs (2) ===\n")
    headings = [line for line in out.splitlines() if line.startswith("===")]
    assert headings == [line for line in run(capsys, command, "--simulate", "t4-shared").splitlines()
                        if line.startswith("===")]


def test_one_instance_json_is_the_report_itself(capsys, tmp_path):
    one = config(tmp_path, "{simulate: t4-shared}")
    document = json.loads(run(capsys, "check", "--config", one, "--json"))
    assert "instances" not in document
    assert list(document) == list(json.loads(run(capsys, "check", "--simulate", "t4-shared", "--json")))
    assert list(document)[0] == "summary"
