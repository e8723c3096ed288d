"""The funnel's activity basis across the faults scenario's driver reload. GPM gives the averages between
two samples a run apart, and a reload loses the earlier one: the run right after it judges activity by
utilization, and the node's line says why instead of changing its basis unexplained; a run later GPM
judges every GPU again.

Expected values come from the scenario file, not from the code under test.
"""

import json
import math
from pathlib import Path

import yaml

from gpu_monitoring import simulator
from gpu_monitoring.cli.main import CRITICAL_FOUND, main

from .conftest import INTERVAL

RAW = yaml.safe_load((Path(simulator.__file__).parent / "scenarios" / "faults.yaml").read_text())
RELOAD = next(fault["at"] for fault in RAW["faults"] if fault["kind"] == "driver_reload")
GPUS = len(RAW["devices"])
# Run 1 is at t=0 and each next one an interval later: the first to see the reload.
AFTER = math.ceil(RELOAD / INTERVAL) + 1


def check(capsys, runs: int, *args: str) -> str:
    assert main(["check", "--simulate", "faults", "--runs", str(runs), *args]) in (0, CRITICAL_FOUND)
    return capsys.readouterr().out


def basis(capsys, runs: int) -> str:
    """What the node's line says the activity counts of the last of `runs` runs rest on."""
    (node,) = [line for line in check(capsys, runs).splitlines() if line.startswith("Node: ")]
    return node.split(" (activity: ")[1].split(");")[0]


def test_gpm_judges_every_gpu_before_the_reload(capsys):
    assert basis(capsys, AFTER - 1) == f"gpm {GPUS}"


def test_the_run_after_the_reload_says_why_utilization_judges_its_gpus(capsys):
    assert basis(capsys, AFTER) == (f"utilization {GPUS}; GPM restarts after the driver reload and measures "
                                    f"{GPUS} GPUs again next run")
    summary = json.loads(check(capsys, AFTER, "--json"))["summary"]
    assert summary["activity_sources"] == {"utilization": GPUS} and summary["gpm_restarting"] == GPUS


def test_a_run_later_gpm_judges_every_gpu_again(capsys):
    assert basis(capsys, AFTER + 1) == f"gpm {GPUS}"
    assert json.loads(check(capsys, AFTER + 1, "--json"))["summary"]["gpm_restarting"] == 0
