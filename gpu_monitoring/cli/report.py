"""Run the check on one instance as `datadog-agent check` does, and report what it sent as plain
JSON-able data: the last run's metrics and service checks, and, run by run, its events and the
service checks that changed."""

import json
import math
import os
import time
import uuid
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

from gpu_monitoring.cli.run_by_run import tag_dict
from gpu_monitoring.cli.summary import activity_sources
from gpu_monitoring.metrics.names import FLEET_DEVICES_TOTAL, XID_ERRORS
from gpu_monitoring.metrics.spec import NAMESPACE
from gpu_monitoring.status import Status

DEFAULT_INTERVAL = 15
DEFAULT_RUNS = 2
# Seconds between runs on a real node: rates need two runs, a person waits for them.
REAL_NODE_WAIT = 1
# datadog_checks.base.stubs.aggregator.check_tag_names refuses env, service, version and the other
# generic tags unless this is set: a rule for integrations' own tags in tests. The Agent sends an
# instance's generic tags as given (AgentCheck renames them only with `disable_generic_tags`).
SKIP_GENERIC_TAGS_CHECK = "DDEV_SKIP_GENERIC_TAGS_CHECK"

Report = Dict[str, Any]


def run(init_config: Dict[str, Any], instance: Dict[str, Any], runs: Optional[int],
        whole_timeline: bool = False) -> Tuple[Report, List[str]]:
    """What `runs` runs sent (by default enough for rates and, on a simulated node, to reach the
    scenario's first fault, or its last with `whole_timeline`), and the errors any run raised.
    A ConfigurationError propagates."""
    from datadog_checks.base.stubs import aggregator

    from gpu_monitoring.check import GpuMonitoringCheck

    with _generic_tags_allowed():
        check = GpuMonitoringCheck("gpu_monitoring", init_config, [instance])
        # An instance of its own, as each `check` command is a process of its own: what a run keeps in the
        # persistent cache (held verdicts, the kernel's cursor, XIDs counted) is not an earlier command's.
        check.check_id = f"gpu_monitoring:cli:{uuid.uuid4()}"
        interval = instance.get("min_collection_interval") or DEFAULT_INTERVAL
        try:
            history, previous, errors = _run(check, runs or runs_to_show(check, interval, whole_timeline), interval,
                                             aggregator)
        finally:
            check.cancel()
        spacing = interval if check.simulated_node is not None else REAL_NODE_WAIT
        timeline = {"timeline_end": _timeline_end(check), "whole_timeline_runs": runs_to_show(check, interval, True)}
        return {**_last_run(aggregator, previous), **history.report(spacing), **timeline}, errors


def _run(check, runs: int, interval: float, aggregator) -> Tuple["_History", Dict[Tuple, float], List[str]]:
    """Run the check `runs` times: what each sent, the counters of the run before the last, the errors."""
    if check.simulated_node is not None:
        # Scenario time moves by the runs' intervals alone: a run sees its scenario time's faults,
        # however long the runs before it took.
        check.simulated_node.nvml.clock.set_speed(0)
    history, previous, counters, errors = _History(), {}, {}, []
    for count in range(runs):
        if count:
            _wait(check, interval)
            previous = counters
        aggregator.reset()
        errors += _error_messages(check.run())
        counters = _counter_values(aggregator)
        history.add(count + 1, _scenario_time(check), _service_checks(aggregator), _events(aggregator),
                    _xid_counts(aggregator))
        history.add_activity(_activity_sources(aggregator), _counters_restarted(previous, counters))
    return history, previous, errors


def runs_to_show(check, interval: float, whole_timeline: bool = False) -> int:
    """Two runs give rates and counts their increase; a simulated node's faults start at a scenario
    time, and the runs go on, one interval apart, until the first has happened (or the last has, and
    ended where it ends, with `whole_timeline`)."""
    end = _timeline_end(check) if whole_timeline else _first_fault(check)
    return DEFAULT_RUNS if end is None else max(DEFAULT_RUNS, math.ceil(end / interval) + 1)


def _faults(check) -> list:
    return check.simulated_node.nvml.scenario.faults if check.simulated_node is not None else []


def _first_fault(check) -> Optional[float]:
    return min((fault.at for fault in _faults(check)), default=None)


def _timeline_end(check) -> Optional[float]:
    """When a simulated node's last fault has happened, and ended where it lasts (a GPU off the bus
    comes back after `lost_for`)."""
    return max((fault.at + (fault.duration or fault.params.get("lost_for") or 0) for fault in _faults(check)),
               default=None)


def _scenario_time(check) -> Optional[float]:
    # To a tenth of a second: the clock moved a little between the node's start and its freezing.
    return round(check.simulated_node.nvml.now(), 1) if check.simulated_node is not None else None


class _History:
    """Each run's events, and the service checks whose status or message changed since the run before
    (a first run's that are not OK): what happened between the first run and the last."""

    def __init__(self) -> None:
        self.runs: List[Dict[str, Any]] = []
        self.events: List[dict] = []
        self.changes: List[dict] = []
        self.xids: List[dict] = []
        self.activity: List[dict] = []
        self._before: Dict[Tuple, Tuple[str, str]] = {}

    def add(self, number: int, at: Optional[float], service_checks: List[dict], events: List[dict],
            xids: List[dict]) -> None:
        when = {"run": number, "at": at}
        self.runs.append(when)
        self.events += [dict(event, **when) for event in events]
        self.xids += [dict(xid, **when) for xid in xids]
        for check in service_checks:
            key, now = (check["name"], tuple(check["tags"])), (check["status"], check["message"])
            was = self._before.get(key)
            if _changed(was, now):
                self.changes.append(dict(check, was=was[0] if was else None, **when))
            self._before[key] = now

    def add_activity(self, sources: Dict[str, float], restarted: List[str]) -> None:
        """What the last run added judged activity by, and the GPUs whose counters it saw start again."""
        self.activity.append(dict(self.runs[-1], activity_sources=sources, counters_restarted=restarted))

    def report(self, interval: float) -> Dict[str, Any]:
        return {"runs": self.runs, "interval": interval, "events": self.events, "changes": self.changes,
                "xids": self.xids, "activity_by_run": self.activity}


def _changed(was: Optional[Tuple[str, str]], now: Tuple[str, str]) -> bool:
    """A new status, or a new reason for one that is not OK; a check first seen changed if not OK."""
    if was is None:
        return now[0] != Status.OK.name
    return now[0] != was[0] or (now[0] != Status.OK.name and now[1] != was[1])


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
    """A simulated node skips ahead one collection interval; a real one waits."""
    if check.simulated_node is not None:
        check.simulated_node.nvml.advance(interval)
    else:
        time.sleep(REAL_NODE_WAIT)


def _counter_values(aggregator) -> Dict[Tuple, float]:
    values = {}
    for name in aggregator.metric_names:
        for stub in aggregator.metrics(name):
            if stub.type == aggregator.MONOTONIC_COUNT:
                values[(name, tuple(stub.tags))] = stub.value
    return values


def _activity_sources(aggregator) -> Dict[str, float]:
    name = f"{NAMESPACE}.{FLEET_DEVICES_TOTAL}"
    return activity_sources([{"name": name, "value": stub.value, "tags": stub.tags}
                             for stub in aggregator.metrics(name)])


def _counters_restarted(previous: Dict[Tuple, float], counters: Dict[Tuple, float]) -> List[str]:
    """The GPUs a counter of went back since the run before: what a driver reload does to the energy
    counter ("since the driver was last reloaded", nvml.h on nvmlDeviceGetTotalEnergyConsumption) and
    the volatile ECC counts."""
    return sorted({tag_dict(tags).get("gpu_index") for (name, tags), value in counters.items()
                   if value < previous.get((name, tags), value)} - {None})


def _last_run(aggregator, previous: Dict[Tuple, float]) -> Report:
    """The last run's metrics and service checks; monotonic counts show the increase since the run
    before, as the Agent sends."""
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
    return {"metrics": metrics, "service_checks": _service_checks(aggregator)}


def _service_checks(aggregator) -> List[dict]:
    return [
        {"name": name, "status": Status(sc.status).name, "tags": sorted(sc.tags), "message": sc.message or ""}
        for name in sorted(aggregator._service_checks)
        for sc in aggregator.service_checks(name)
    ]


def _events(aggregator) -> List[dict]:
    return [
        {"title": e["msg_title"], "text": e["msg_text"], "alert_type": e.get("alert_type", "info"),
         "tags": sorted(e.get("tags") or [])}
        for e in aggregator.events
    ]


def _xid_counts(aggregator) -> List[dict]:
    """The run's XID counts with their tags: every run's, since XIDs come in one run and not the next."""
    stubs = aggregator.metrics(f"{NAMESPACE}.{XID_ERRORS}")
    return [{"value": stub.value, "tags": sorted(stub.tags)} for stub in stubs]


def _error_messages(error: str) -> List[str]:
    """AgentCheck.run() answers "" or a JSON list of the errors it caught."""
    if not error:
        return []
    try:
        return [item["message"] for item in json.loads(error)]
    except (ValueError, KeyError, TypeError):
        return [error]
