"""`check --series` lists every series as Datadog receives it: every tag it was sent with, its value
in the unit metrics.yaml gives it, and no line that ends in a space, wrapped or not.

Expected tags come from the same run's `--json`; expected units from metrics.yaml itself.
"""

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from gpu_monitoring.cli.main import CRITICAL_FOUND, main

from .conftest import tag_dict

ROOT = Path(__file__).resolve().parents[1]
SERIES_HEADING = "=== Series sent to Datadog"
PORT_TAGS = ("ib_device", "ib_port", "link_layer", "netdev")
# How Datadog writes the units the port rate may have (its unit catalogue's short names).
RATE_SYMBOLS = {"gigabit": "Gb", "megabit": "Mb", "bit": "b"}


def cli(capsys, *args, code=0):
    assert main(["check", *args]) == code
    return capsys.readouterr().out


def listing(capsys, scenario="dgx-h100", code=0):
    """The run's series listing, one line a series (the suite leaves text unwrapped), and its `--json`."""
    report = json.loads(cli(capsys, "--simulate", scenario, "--json", code=code))
    out = cli(capsys, "--simulate", scenario, "--series", code=code)
    return out.split(SERIES_HEADING)[1], report


def metric_lines(series, name):
    return [line for line in series.splitlines() if line.startswith(name + " ")]


def shown_tags(line):
    return tag_dict(line.split()[-1].split(","))


def test_a_network_port_line_names_its_port(capsys):
    series, report = listing(capsys)
    ports = [m for m in report["metrics"] if m["name"].startswith("gpu_monitoring.network.port.")]
    assert len({tag_dict(m["tags"])["ib_device"] for m in ports}) == 10
    lines = [line for line in series.splitlines() if line.startswith("gpu_monitoring.network.port.")]
    assert len(lines) == len(ports)
    for line, sent in zip(lines, ports):
        assert {tag: shown_tags(line).get(tag) for tag in PORT_TAGS} == \
               {tag: tag_dict(sent["tags"])[tag] for tag in PORT_TAGS}, line
    # One line a port and metric: none is told from another by nothing.
    assert len(set(lines)) == len(lines)


def test_clocks_event_time_percent_lines_differ_by_throttle_reason(capsys):
    series, report = listing(capsys)
    lines = metric_lines(series, "gpu_monitoring.clocks_event.time_percent")
    sent = defaultdict(set)
    for m in report["metrics"]:
        if m["name"] == "gpu_monitoring.clocks_event.time_percent":
            tags = tag_dict(m["tags"])
            sent[tags["gpu_index"]].add(tags["throttle_reason"])
    assert max(map(len, sent.values())) > 1
    shown = defaultdict(set)
    for line in lines:
        tags = shown_tags(line)
        shown[tags["gpu_index"]].add(tags["throttle_reason"])
    assert shown == sent
    assert len(set(lines)) == len(lines)


def test_the_port_rate_is_in_the_spec_unit(capsys):
    spec = yaml.safe_load((ROOT / "gpu_monitoring" / "metrics" / "metrics.yaml").read_text())["network.port.rate"]
    unit = f"{RATE_SYMBOLS[spec['unit']]}/{spec['per_unit'][0]}"
    series, report = listing(capsys)
    rates = {tag_dict(m["tags"])["ib_device"]: m["value"] for m in report["metrics"]
             if m["name"] == "gpu_monitoring.network.port.rate"}
    lines = metric_lines(series, "gpu_monitoring.network.port.rate")
    assert len(lines) == len(rates) == 10
    for line in lines:
        value = rates[shown_tags(line)["ib_device"]]
        assert re.search(rf" {value:,.0f} {re.escape(unit)}  ", line), line


@pytest.mark.parametrize("columns", [None, 100, 72])
@pytest.mark.parametrize("scenario, code", [("dgx-h100", 0), ("faults", CRITICAL_FOUND)])
def test_no_line_ends_in_a_space(capsys, monkeypatch, columns, scenario, code):
    if columns:
        monkeypatch.setenv("COLUMNS", str(columns))
    out = cli(capsys, "--simulate", scenario, "--series", code=code)
    series = out.split(SERIES_HEADING)[1]
    assert [line for line in series.splitlines() if line != line.rstrip()] == []
    if columns:
        # Only a tag longer than the room (a container's 64-digit ID) may stay wider, whole, alone.
        wider = [line for line in series.splitlines() if len(line) > columns]
        assert all(len(line.split()) == 1 for line in wider), wider


@pytest.mark.parametrize("scenario, code", [("dgx-h100", 0), ("hpc-slurm", 0), ("faults", CRITICAL_FOUND)])
def test_every_tag_of_every_series_is_shown(capsys, scenario, code):
    series, report = listing(capsys, scenario, code)
    sections = {"metrics": ("--- Metrics (", "--- Service checks ("),
                "service_checks": ("--- Service checks (", "--- Events (")}
    for key, (heading, next_heading) in sections.items():
        lines = [line for line in series.split(heading)[1].split(next_heading)[0].splitlines()[1:] if line.strip()]
        assert len(lines) == len(report[key])
        for line, sent in zip(lines, report[key]):
            assert line.startswith(sent["name"] + " ")
            assert not sent["tags"] or line.split()[-1].split(",") == sent["tags"], (line, sent["tags"])


def test_wrapped_tags_stay_whole(capsys, monkeypatch):
    series, report = listing(capsys, "faults", CRITICAL_FOUND)
    monkeypatch.setenv("COLUMNS", "72")
    wrapped = cli(capsys, "--simulate", "faults", "--series", code=CRITICAL_FOUND).split(SERIES_HEADING)[1]
    words = set(re.split(r"[,\s]+", wrapped))
    sent = {tag for item in report["metrics"] + report["service_checks"] + report["events"] for tag in item["tags"]}
    assert sent - words == set()
    # A series goes on below its first line indented, so that each first line starts a series.
    firsts = [line for line in wrapped.splitlines() if line.startswith("gpu_monitoring.")]
    assert len(firsts) == len(report["metrics"]) + len(report["service_checks"])
    assert series.count("\ngpu_monitoring.") == len(firsts)
