"""What several check runs showed between the first and the last, for a person to read: the service
checks that changed and the events, each under the run that sent it; which run the summary's tables
show; and, on a simulated node, how far into its scenario's faults the runs went."""

from itertools import groupby
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from gpu_monitoring.cli.wrapping import fit

NAMESPACE = "gpu_monitoring."
_CHANGE_ROW = "  {:<22} {:<7} {:<18} {}"
_CHANGE_INDENT = 2 + 22 + 1 + 7 + 1 + 18 + 1
_EVENT_TEXT = "    "


def tag_dict(tags: Iterable[str]) -> Dict[str, str]:
    return dict(tag.split(":", 1) for tag in tags if ":" in tag)


def where(check: dict) -> str:
    """What a service check judges: a GPU, or the node."""
    index = tag_dict(check["tags"]).get("gpu_index")
    return "node" if index is None else f"GPU {index}"


def several_runs(report: Dict[str, Any]) -> bool:
    return len(report["runs"]) > 1


def change_lines(report: Dict[str, Any], width: Optional[int]) -> List[str]:
    """The service checks whose status, or reason for not being OK, changed from one run to the next."""
    changes = report["changes"]
    if not several_runs(report) or not changes:
        return []
    lines = [f"\n=== Service checks that changed, run by run ({len(changes)}) ==="]
    for when, group in _by_run(changes):
        lines.append(when)
        for check in group:
            row = _CHANGE_ROW.format(check["name"][len(NAMESPACE):], where(check), _status_change(check),
                                     check["message"])
            lines += fit(row.rstrip(), width, _CHANGE_INDENT)
    return lines


def _status_change(check: dict) -> str:
    # The same status again comes with a new reason for it, which the row shows.
    if check["was"] in (None, check["status"]):
        return check["status"]
    return f"{check['was']} → {check['status']}"


def event_lines(report: Dict[str, Any], width: Optional[int]) -> List[str]:
    """Every run's events, under the run that sent each where there were several. The title names the
    fault; an event's last line says what to do about it."""
    events = report["events"]
    lines = [f"\n=== Events ({len(events)}) ==="]
    for when, group in _by_run(events):
        if several_runs(report):
            lines.append(when)
        for event in group:
            last = (event["text"].strip().splitlines() or [""])[-1]
            lines += fit(f"[{event['alert_type']}] {event['title']}", width, len(_EVENT_TEXT))
            lines += fit(f"{_EVENT_TEXT}{last}", width, 2 * len(_EVENT_TEXT))
    return lines


def runs_lines(report: Dict[str, Any], width: Optional[int]) -> List[str]:
    """Which run the tables show, and where a simulated node's faults go on past the last run, how to see them."""
    if not several_runs(report):
        return []
    last = report["runs"][-1]
    lines = fit(f"The tables show {_run_name(last['run'], last['at'])}, the last of {len(report['runs'])} "
                f"runs {report['interval']:g} s apart; the changes and events below are every run's.", width, 0)
    end = report["timeline_end"]
    if end is not None and last["at"] is not None and last["at"] < end:
        lines += fit(f"The scenario's faults go on to t={end:.0f} s: --whole-timeline runs through them "
                     f"({report['whole_timeline_runs']} runs).", width, 0)
    return lines


def _by_run(items: List[dict]) -> Iterator[Tuple[str, Iterator[dict]]]:
    for (number, at), group in groupby(items, key=lambda item: (item["run"], item["at"])):
        yield _run_name(number, at), group


def _run_name(number: int, at: Optional[float]) -> str:
    """A run, with a simulated node's scenario time."""
    return f"run {number}" + ("" if at is None else f" (t={at:.0f} s)")
