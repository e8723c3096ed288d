"""`check` and `status` fit their text to the terminal (COLUMNS, else the terminal's width, else 100
columns): a line wider goes on below, indented to where its free text begins; `--json` is never wrapped.

Every test sets its width: the suite's own (tests/conftest.py) leaves the text unwrapped.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_monitoring import simulator
from gpu_monitoring.cli.main import CRITICAL_FOUND, main
from gpu_monitoring.cli.summary import MAX_HOLDERS_NAMED
from gpu_monitoring.cli.wrapping import DEFAULT_WIDTH

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted(path.stem for path in (Path(simulator.__file__).parent / "scenarios").glob("*.yaml"))
# Where a scenario's GPUs end up: exit 0, or 3 where a service check of the last run is CRITICAL.
EITHER = (0, CRITICAL_FOUND)


def run(capsys, monkeypatch, columns, *args, code=CRITICAL_FOUND):
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(list(args)) in (code if isinstance(code, tuple) else (code,))
    return capsys.readouterr().out


def not_ok(capsys, monkeypatch):
    """The messages of the service checks not OK and the events' texts of the faults scenario's runs."""
    report = json.loads(run(capsys, monkeypatch, 60, "check", "--simulate", "faults", "--json"))
    messages = [check["message"] for check in report["service_checks"] if check["status"] != "OK"]
    return messages + [event["title"] for event in report["events"]]


def test_every_line_fits_and_says_all_it_said(capsys, monkeypatch):
    texts = not_ok(capsys, monkeypatch)
    assert max(map(len, texts)) > 100
    for width in (100, 72):
        out = run(capsys, monkeypatch, width, "check", "--simulate", "faults", "--series")
        lines = out.splitlines()
        assert max(map(len, lines)) <= width, [line for line in lines if len(line) > width]
        flat = " ".join(out.split())
        for text in texts:
            assert " ".join(text.split()) in flat, text


def test_a_wrapped_row_goes_on_under_its_message(capsys, monkeypatch):
    out = run(capsys, monkeypatch, 100, "status", "--simulate", "faults")
    section = out.split("=== Service checks not OK")[1].split("\n\n")[0].splitlines()[1:]
    (row,) = [i for i, line in enumerate(section) if line.startswith("device.health          CRITICAL  GPU 2")]
    message_column = section[row].index("GPU lost")
    follows = section[row + 1]
    assert follows[:message_column].strip() == "" and follows[message_column] != " ", (section[row], follows)
    # The verdict wraps under its own text too.
    verdict = out.rstrip().split("\n\n")[-1].splitlines()
    assert verdict[0].startswith("Status: CRITICAL:") and all(line.startswith(" " * len("Status: ")) for line in
                                                              verdict[1:])


def test_json_is_never_wrapped(capsys, monkeypatch):
    out = run(capsys, monkeypatch, 40, "check", "--simulate", "faults", "--json")
    report = json.loads(out)
    longest = max((c["message"] for c in report["service_checks"]), key=len)
    assert len(longest) > 40 and json.dumps(longest, ensure_ascii=False) in out


def test_without_a_terminal_the_text_is_100_columns_wide():
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run([sys.executable, "-m", "gpu_monitoring.cli", "check", "--simulate", "faults"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == CRITICAL_FOUND, done.stderr
    lines = done.stdout.splitlines()
    assert DEFAULT_WIDTH == 100 and max(map(len, lines)) <= DEFAULT_WIDTH
    assert max(map(len, lines)) > DEFAULT_WIDTH - 10, "nothing came near the width: no line was wrapped"


def gpu_table(out):
    """The GPU table's lines, each GPU's first: from its column header to the node's line."""
    lines = out.split("=== GPUs")[1].split("\nNode: ")[0].splitlines()
    return lines[[line.startswith("gpu ") for line in lines].index(True) + 1:]


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_gpu_a_line_at_100_columns(capsys, monkeypatch, name):
    gpus = json.loads(run(capsys, monkeypatch, DEFAULT_WIDTH, "check", "--simulate", name, "--json",
                          code=EITHER))["summary"]["gpus"]
    out = run(capsys, monkeypatch, DEFAULT_WIDTH, "check", "--simulate", name, code=EITHER)
    lines = out.splitlines()
    assert max(map(len, lines)) <= DEFAULT_WIDTH, [line for line in lines if len(line) > DEFAULT_WIDTH]
    table = gpu_table(out)
    rows = [i for i, line in enumerate(table) if line[:1].isdigit()]
    assert [table[i].split()[0] for i in rows] == [gpu["gpu_index"] for gpu in gpus]
    for gpu, start, end in zip(gpus, rows, rows[1:] + [len(table)]):
        held, shown = gpu["held_by"], table[start:end]
        if len(shown) > 1:
            # Two holders that do not fit beside the row together: one a line, each whole.
            assert len(shown[0]) - len(held[0]) - 1 + len(", ".join(held)) > DEFAULT_WIDTH, shown
            assert [line.split()[-1].rstrip(",") for line in shown] == held, shown
        else:
            # A row never goes on below: who holds the GPU ends its one line.
            named = ", ".join(held) if len(held) <= MAX_HOLDERS_NAMED else f"{len(held)} workloads"
            assert shown[0].endswith(named or "-"), shown


def test_a_holder_longer_than_the_room_goes_under_its_row(capsys, monkeypatch):
    out = run(capsys, monkeypatch, 72, "check", "--simulate", "dgx-h100", code=0)
    table = gpu_table(out)
    assert max(map(len, table)) <= 72
    assert "    held by inference/vllm-llama-70b-5d8f7c9b6-x2kqp" in table
    assert table[table.index("    held by inference/vllm-llama-70b-5d8f7c9b6-x2kqp") - 1].startswith("2 ")
