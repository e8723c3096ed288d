"""The recommended monitors in assets/monitors, checked offline: they load into the API client's
Monitor model with nothing left over, their thresholds agree with their queries, service check
monitors watch service checks the check sends (every one of them) by tags it puts on them, and
each message says what to do about the GPU, pod, host or cluster it names. Each names, in a tag,
the metrics_profile it needs, and every one works in the default.
"""

import json
import re
from pathlib import Path
from typing import List

import pytest
from datadog_api_client.model_utils import data_to_dict
from datadog_api_client.v1.model.monitor import Monitor

from gpu_monitoring.metrics.spec import PROFILES

from .assets_support import (
    AGENT_TAG_KEYS,
    ASSETS_PROFILE,
    MONITOR_FILES,
    SERVICE_CHECKS,
    _monitor,
    emitted,
    load_strictly,
    metric_refs,
    needed_profile,
    parse_metric_monitor,
)

# A fixture: pytest finds it among this module's names; listed so that linters see it used.
__all__ = ["emitted"]

SERVICE_CHECK_QUERY = re.compile(
    r'^"(?P<check>[\w.]+)"\.over\((?P<over>[^()]*)\)\.by\((?P<by>[^()]*)\)'
    r"\.last\((?P<last>\d+)\)\.count_by_status\(\)$"
)
MONITOR_FIELDS = {"name", "type", "query", "message", "tags", "options", "priority"}
# Functions that count a query's groups into one series: a monitor of them is a simple alert.
COUNTING = re.compile(r"\bcount_(?:nonzero|not_null)\(")


def _monitor_files(monitor_type: str) -> List[Path]:
    return [path for path in MONITOR_FILES if _monitor(path)["type"] == monitor_type]


def monitor_group_keys(monitor: dict) -> List[str]:
    if monitor["type"] == "service check":
        match = SERVICE_CHECK_QUERY.match(monitor["query"])
        return [key.strip().strip('"') for key in match["by"].split(",")]
    if COUNTING.search(monitor["query"]):
        return []
    groups = {tuple(ref.by) for ref in metric_refs(monitor["query"])}
    assert len(groups) == 1, f"the series of a formula must be grouped alike: {groups}"
    return list(groups.pop())


# --- loading into the API client's models ----------------------------------------------------


@pytest.mark.parametrize("path", MONITOR_FILES, ids=lambda p: p.name)
def test_monitor_loads_into_the_api_model(path):
    model = load_strictly(json.dumps(_monitor(path)), Monitor)
    assert data_to_dict(model) == _monitor(path)


BROKEN_MONITORS = {
    "unknown option": lambda m: m["options"].update(notify_nodata=True),
    "monitor type": lambda m: m.update(type="metric_alert"),
    "threshold type": lambda m: m["options"]["thresholds"].update(critical="high"),
    "read-only field": lambda m: m.update(id=1),
}


@pytest.mark.parametrize("breakage", BROKEN_MONITORS, ids=str)
def test_a_broken_monitor_does_not_load(breakage):
    monitor = _monitor(MONITOR_FILES[0])
    BROKEN_MONITORS[breakage](monitor)
    with pytest.raises((AssertionError, TypeError, ValueError)):
        load_strictly(json.dumps(monitor), Monitor)


# --- monitors --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", MONITOR_FILES, ids=lambda p: p.name)
def test_monitor_fields(path):
    monitor = _monitor(path)
    assert set(monitor) == MONITOR_FIELDS
    assert monitor["type"] in ("query alert", "service check")
    assert 1 <= monitor["priority"] <= 5
    assert "integration:gpu_monitoring" in monitor["tags"]


@pytest.mark.parametrize("path", _monitor_files("query alert"), ids=lambda p: p.name)
def test_metric_monitor_thresholds(path):
    monitor = _monitor(path)
    query = parse_metric_monitor(monitor["query"])
    thresholds = monitor["options"]["thresholds"]
    # The API refuses a critical threshold that differs from the query's.
    assert float(thresholds["critical"]) == float(query["threshold"])
    if "warning" in thresholds:
        if query["op"].startswith(">"):
            assert thresholds["warning"] < thresholds["critical"]
        else:
            assert thresholds["warning"] > thresholds["critical"]
    assert metric_refs(monitor["query"]), "a metric monitor queries the check's metrics"


@pytest.mark.parametrize("path", _monitor_files("service check"), ids=lambda p: p.name)
def test_service_check_monitor(path, emitted):
    monitor = _monitor(path)
    match = SERVICE_CHECK_QUERY.match(monitor["query"])
    assert match, f"not a service check query: {monitor['query']!r}"
    assert match["check"] in SERVICE_CHECKS, f"{match['check']} is not in assets/service_checks.json"
    keys = emitted.service_checks[match["check"]] | AGENT_TAG_KEYS
    group_keys = set(monitor_group_keys(monitor))
    assert group_keys <= keys, f"{match['check']} has no tag {group_keys - keys}"
    thresholds = monitor["options"]["thresholds"]
    # The monitor looks at the last N statuses; N must cover the largest threshold.
    assert int(match["last"]) >= max(thresholds.values())


@pytest.mark.parametrize("path", MONITOR_FILES, ids=lambda p: p.name)
def test_monitor_names_the_profile_it_needs(path):
    monitor = _monitor(path)
    refs = metric_refs(monitor["query"]) if monitor["type"] == "query alert" else []
    needed = needed_profile(refs)
    assert [tag for tag in monitor["tags"] if tag.startswith("metrics_profile:")] == [f"metrics_profile:{needed}"]
    assert PROFILES.index(needed) <= PROFILES.index(ASSETS_PROFILE), f"{path.name} needs {needed}"


def test_every_service_check_has_a_monitor():
    watched = {SERVICE_CHECK_QUERY.match(_monitor(path)["query"])["check"] for path in _monitor_files("service check")}
    assert set(SERVICE_CHECKS) <= watched


@pytest.mark.parametrize("path", MONITOR_FILES, ids=lambda p: p.name)
def test_monitor_message_tells_what_to_do(path):
    monitor = _monitor(path)
    message = monitor["message"]
    alert = re.search(r"\{\{#is_alert\}\}(.*?)\{\{/is_alert\}\}", message, re.S)
    assert alert and len(alert[1].strip()) > 100, "an alert section that says what to do"
    for block in ("is_alert", "is_warning", "is_recovery", "is_exact_match"):
        assert len(re.findall(r"\{\{#" + block + r"\b", message)) == message.count("{{/" + block + "}}"), block
    if "warning" in monitor["options"]["thresholds"] and monitor["type"] == "query alert":
        assert "{{#is_warning}}" in message
    # Tag variables only exist for the keys the monitor groups by.
    groups = set(monitor_group_keys(monitor))
    used = set(re.findall(r"\{\{(\w+)\.name\}\}", monitor["name"] + message))
    used |= set(re.findall(r'is_exact_match "(\w+)\.name"', message))
    assert used <= groups, f"variables {used - groups} are not in the monitor's groups {groups}"
    if groups:
        assert used, "the message names the GPU, pod, host or cluster it is about"
    else:  # a simple alert names no group: its message names the tags it counts hosts or GPUs by
        counted = {key for ref in metric_refs(monitor["query"]) for key in ref.by}
        assert counted and all(f"`{key}`" in message for key in counted), counted
    if monitor["type"] == "service check":
        assert "{{check_message}}" in message
