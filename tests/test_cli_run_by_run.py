"""`gpu-monitoring check` over several runs shows every run's events and the service checks that changed
from one run to the next, each under its run; `make demo SCENARIO=faults` runs through the scenario's
whole timeline and shows every fault of it; a run that stops before the timeline's end says how to see
the rest.

Expected faults come from the scenario file, not from the code under test.
"""

import json
import math
import re
from pathlib import Path
from typing import Dict, List

import yaml

from gpu_monitoring import simulator
from gpu_monitoring.cli.main import CRITICAL_FOUND, main

from .conftest import INTERVAL
from .sidecar_support import SidecarProcess, wait_until

ROOT = Path(__file__).resolve().parents[1]
FAULTS = yaml.safe_load((Path(simulator.__file__).parent / "scenarios" / "faults.yaml").read_text())["faults"]
RUN = re.compile(r"^run (\d+)(?: \(t=(\d+) s\))?$")
# Faults the node's node.health tells, naming the port; the others a GPU's device.health or an event.
NODE_FAULTS = {"port_flap", "port_slow", "nic_fault"}


def demo_arguments(scenario: str) -> List[str]:
    """The `gpu-monitoring` arguments `make demo SCENARIO=<scenario>` runs, read from the Makefile."""
    recipe = re.search(r"^demo:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    command = recipe.split("||")[0].replace("$(SCENARIO)", scenario).split()
    assert command[0] == "$(BIN)/gpu-monitoring", recipe
    return command[1:]


def main_out(capsys, *args: str, code: int = 0) -> str:
    assert main(list(args)) == code
    return capsys.readouterr().out


def by_run(section: str) -> Dict[float, List[str]]:
    """A section's lines under each run's heading, by the run's scenario time (its number without one)."""
    runs: Dict[float, List[str]] = {}
    current = None
    for line in section.splitlines():
        found = RUN.match(line)
        if found:
            current = runs.setdefault(float(found.group(2) or found.group(1)), [])
        elif current is not None and line.strip():
            current.append(line)
    return runs


def seen_at(at: float) -> float:
    """The scenario time of the first run (runs are one interval apart from t=0) that sees a fault of `at`."""
    return math.ceil(at / INTERVAL) * INTERVAL


def test_the_faults_demo_shows_every_fault_of_its_timeline_under_the_run_that_saw_it(capsys):
    code = main(demo_arguments("faults"))
    out = capsys.readouterr().out
    assert code in (0, CRITICAL_FOUND)
    last = max(fault["at"] + fault.get("duration", fault.get("lost_for", 0)) for fault in FAULTS)
    runs = math.ceil(last / INTERVAL) + 1
    assert f"The tables show run {runs} (t={(runs - 1) * INTERVAL} s), the last of {runs} runs" in out
    assert "--whole-timeline runs through them" not in out
    summary = out.split("=== Series sent to Datadog")[0]
    changes = by_run(summary.split("=== Service checks that changed, run by run")[1].split("\n\n")[0])
    events = by_run(summary.split("=== Events")[1].split("\n\n")[0])
    for fault in FAULTS:
        when = seen_at(fault["at"])
        if fault["kind"] == "xid":
            count = f" × {fault['count']:,}" if fault.get("count", 1) > 1 else ""
            title = f"XID {fault['xid']}{count} on GPU {fault['device']} "
            assert any(title in line for line in events.get(when, [])), (fault, events)
        elif fault["kind"] in NODE_FAULTS:
            device = fault["port"].split("/")[0]
            rows = [line for line in changes.get(when, []) if line.split()[:2] == ["node.health", "node"]]
            assert any(device in row for row in rows), (fault, changes.get(when))
        elif fault["kind"] == "aer":
            # Told by the GPU's own reasons, whatever its status was already.
            severity = {"corrected": "corrected", "nonfatal": "non-fatal", "fatal": "fatal"}[fault["severity"]]
            block = " ".join(" ".join(changes.get(when, [])).split())
            assert f"{fault['count']:,} {severity}" in block and "PCIe error" in block, (fault, changes.get(when))
        elif fault["kind"] == "driver_reload":
            # The reload clears what only it clears: the double-bit ECC error held CRITICAL since.
            (ecc,) = [f for f in FAULTS if f["kind"] == "ecc_dbe"]
            assert f"  device.health          GPU {ecc['device']}   CRITICAL → OK" in changes[when], changes[when]
        else:
            rows = [line for line in changes.get(when, []) if line.split()[1:3] == ["GPU", str(fault["device"])]]
            assert rows and "→" in rows[0], (fault, changes.get(when))


def test_a_run_that_stops_before_the_timelines_end_says_how_to_see_the_rest(capsys):
    out = main_out(capsys, "check", "--simulate", "faults", code=CRITICAL_FOUND)
    shown = seen_at(min(fault["at"] for fault in FAULTS))
    assert f"The tables show run {shown // INTERVAL + 1:.0f} (t={shown:.0f} s)" in out
    assert "The scenario's faults go on to t=110 s: --whole-timeline runs through them (9 runs)." in out


def test_json_gives_every_run_its_events_and_changes(capsys):
    report = json.loads(main_out(capsys, "check", "--simulate", "faults", "--whole-timeline", "--json"))
    assert [run["at"] for run in report["runs"]] == [n * INTERVAL for n in range(len(report["runs"]))]
    (storm,) = [f for f in FAULTS if f["kind"] == "xid" and f.get("count", 1) > 1]
    storm_run = seen_at(storm["at"]) // INTERVAL + 1
    assert [e["run"] for e in report["events"] if " × " in e["title"]] == [storm_run]
    assert {e["run"] for e in report["events"]} == {seen_at(FAULTS[0]["at"]) // INTERVAL + 1, storm_run}
    reload = seen_at(next(f["at"] for f in FAULTS if f["kind"] == "driver_reload"))
    assert any(c["at"] == reload and (c["was"], c["status"]) == ("CRITICAL", "OK") for c in report["changes"])


def test_sidecar_mode_shows_the_events_the_first_run_read(capsys, tmp_path, datadog_agent):
    # The sidecar journals the XIDs of t=20; the check's first run reads them, its second none.
    sidecar = SidecarProcess(tmp_path, "faults", "--start-at", "15", "--speed", "2").start()
    try:
        wait_until(lambda: len(sidecar.journaled()) >= 4, 30, "the XIDs of t=20 never reached the journal")
        report = json.loads(main_out(capsys, "check", "--socket", sidecar.socket, "--runs", "2", "--json",
                                     code=CRITICAL_FOUND))
        datadog_agent.reset()  # forgets the cursor the first command stored: the second reads the journal again
        text = main_out(capsys, "check", "--socket", sidecar.socket, "--runs", "2", code=CRITICAL_FOUND)
    finally:
        sidecar.stop()
    assert [run["at"] for run in report["runs"]] == [None, None]
    xids = {(e["run"], e["title"].split(" (")[0]) for e in report["events"]}
    assert {(1, "XID 79 on GPU 2"), (1, "XID 13 on GPU 1"), (1, "XID 63 on GPU 5")} <= xids
    events = by_run(text.split("=== Events")[1].split("\n\n")[0])
    assert any(line.startswith("[error] XID 79 on GPU 2") for line in events[1]), events


def test_the_readme_says_what_make_demo_runs():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"`make demo` runs `gpu-monitoring {' '.join(demo_arguments('dgx-h100'))}`" in readme
