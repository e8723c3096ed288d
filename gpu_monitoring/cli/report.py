"""Run the check on one instance as `datadog-agent check` does, and report what the last run sent:
its metrics, service checks and events, as plain JSON-able data."""

import json
import math
import os
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

from gpu_monitoring.health.service_checks import Status

DEFAULT_INTERVAL = 15
DEFAULT_RUNS = 2
# datadog_checks.base.stubs.aggregator.check_tag_names refuses env, service, version and the other
# generic tags unless this is set: a rule for integrations' own tags in tests. The Agent sends an
# instance's generic tags as given (AgentCheck renames them only with `disable_generic_tags`).
SKIP_GENERIC_TAGS_CHECK = "DDEV_SKIP_GENERIC_TAGS_CHECK"

Report = Dict[str, list]


def run(init_config: Dict[str, Any], instance: Dict[str, Any], runs: Optional[int]) -> Tuple[Report, List[str]]:
    """The last of `runs` runs (by default enough for rates and, on a simulated node, to reach the
    scenario's first fault), and the errors any run raised. A ConfigurationError propagates."""
    from datadog_checks.base.stubs import aggregator

    from gpu_monitoring.check import GpuMonitoringCheck

    with _generic_tags_allowed():
        check = GpuMonitoringCheck("gpu_monitoring", init_config, [instance])
        interval = instance.get("min_collection_interval") or DEFAULT_INTERVAL
        errors: List[str] = []
        previous: Dict[Tuple, float] = {}
        try:
            for count in range(runs or runs_to_show(check, interval)):
                if count:
                    _wait(check, interval)
                    previous = _counter_values(aggregator)
                aggregator.reset()
                errors += _error_messages(check.run())
        finally:
            check.cancel()
        return _report(aggregator, previous), errors


def runs_to_show(check, interval: float) -> int:
    """Two runs give rates and counts their increase; a simulated node's faults start at a scenario
    time, and the runs go on, one interval apart, until the first has happened."""
    faults = check.simulated_node.nvml.scenario.faults if check.simulated_node is not None else []
    if not faults:
        return DEFAULT_RUNS
    return max(DEFAULT_RUNS, math.ceil(faults[0].at / interval) + 1)


@contextmanager
def _generic_tags_allowed() -> Iterator[None]:
    saved = os.environ.get(SKIP_GENERIC_TAGS_CHECK)
    os.environ[SKIP_GENERIC_TAGS_CHECK] = "true"
    try:
        yield
    finally:
        if saved is None:
            del os.environ[SKIP_GENERIC_TAGS_CHECK]
        else:
            os.environ[SKIP_GENERIC_TAGS_CHECK] = saved


def _wait(check, interval: float) -> None:
    """A simulated node skips ahead one collection interval; a real one waits a second."""
    if check.simulated_node is not None:
        check.simulated_node.nvml.advance(interval)
    else:
        time.sleep(1)


def _counter_values(aggregator) -> Dict[Tuple, float]:
    values = {}
    for name in aggregator.metric_names:
        for stub in aggregator.metrics(name):
            if stub.type == aggregator.MONOTONIC_COUNT:
                values[(name, tuple(stub.tags))] = stub.value
    return values


def _report(aggregator, previous: Dict[Tuple, float]) -> Report:
    """The last run; monotonic counts show the increase since the run before, as the Agent sends."""
    metrics = []
    type_names = {v: k for k, v in vars(type(aggregator)).items() if k.isupper() and isinstance(v, int)}
    for name in sorted(aggregator.metric_names):
        for stub in aggregator.metrics(name):
            kind = type_names.get(stub.type, str(stub.type)).lower()
            value = stub.value
            if stub.type == aggregator.MONOTONIC_COUNT:
                before = previous.get((name, tuple(stub.tags)))
                if before is None or value < before:
                    continue
                value -= before
            metrics.append({"name": name, "type": kind, "value": value, "tags": sorted(stub.tags)})
    service_checks = [
        {"name": name, "status": Status(sc.status).name, "tags": sorted(sc.tags), "message": sc.message or ""}
        for name in sorted(aggregator._service_checks)
        for sc in aggregator.service_checks(name)
    ]
    events = [
        {"title": e["msg_title"], "text": e["msg_text"], "alert_type": e.get("alert_type", "info"),
         "tags": sorted(e.get("tags") or [])}
        for e in aggregator.events
    ]
    return {"metrics": metrics, "service_checks": service_checks, "events": events}


def _error_messages(error: str) -> List[str]:
    """AgentCheck.run() answers "" or a JSON list of the errors it caught."""
    if not error:
        return []
    try:
        return [item["message"] for item in json.loads(error)]
    except (ValueError, KeyError, TypeError):
        return [error]
