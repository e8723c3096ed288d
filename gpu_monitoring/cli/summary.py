"""The summary of a check run for a person to read: a line per GPU with its load, health, what it
costs and who holds it, the node's funnel and cost, every service check that is not OK with its
message, what changed run by run and the events, and each workload's cost.

It reads only the report of what the check submitted, so it shows what Datadog would receive;
a metric the instance does not send (a profile or `metric_patterns` left it out) shows as "-".
"""

from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

from gpu_monitoring.attribution.fleet import STAGES
from gpu_monitoring.cli import run_by_run
from gpu_monitoring.cli.run_by_run import NAMESPACE, tag_dict, where
from gpu_monitoring.cli.wrapping import fit
from gpu_monitoring.metrics.names import (
    COST_HOURLY,
    COST_IDLE_HOURLY,
    FLEET_COST_UNALLOCATED_HOURLY,
    FLEET_COST_UNUSABLE_HOURLY,
    FLEET_DEVICES_TOTAL,
    FLEET_DEVICES_UNUSABLE,
    MEMORY_TOTAL,
    MEMORY_USED,
    UTILIZATION_GPU,
    WORKLOAD_COST_HOURLY,
    WORKLOAD_COST_IDLE_HOURLY,
    WORKLOAD_CPU_THROTTLED,
    WORKLOAD_CPU_USAGE,
    WORKLOAD_GPUS,
    WORKLOAD_IDLE,
)
from gpu_monitoring.metrics.units import human
from gpu_monitoring.status import Status

GIB = 1024 ** 3
NO_PRICE = "no price for these GPUs: set hourly_price or default_hourly_price to see cost"
# A GPU held by more workloads than this names how many, not who.
MAX_HOLDERS_NAMED = 2

Summary = Dict[str, Any]


def summarize(report: Dict[str, Any]) -> Summary:
    """The summary as data: `--json` carries it beside the series it is read from."""
    metrics = report["metrics"]
    return {
        "gpus": _gpus(metrics, report["service_checks"]),
        "funnel": {stage: _total(metrics, metric) for stage, metric in STAGES.items()},
        "activity_sources": activity_sources(metrics),
        "gpm_restarting": _gpm_restarting(report.get("activity_by_run", [])),
        "cost": {"hourly": _total(metrics, COST_HOURLY), "idle_hourly": _total(metrics, COST_IDLE_HOURLY),
                 "unallocated_hourly": _total(metrics, FLEET_COST_UNALLOCATED_HOURLY),
                 "unusable_hourly": _total(metrics, FLEET_COST_UNUSABLE_HOURLY)},
        "unusable": _total(metrics, FLEET_DEVICES_UNUSABLE),
        "workloads": _workloads(metrics),
        "idle_workloads": _idle_workloads(metrics),
        "application_xids": _application_xids(report.get("xids", [])),
        "service_checks_not_ok": [check for check in report["service_checks"] if check["status"] != Status.OK.name],
    }


def summary_lines(report: Dict[str, Any], width: Optional[int] = None) -> List[str]:
    """The summary's text, each line fitted to `width` columns (none: as long as it is)."""
    summary = summarize(report)
    return [
        *_gpu_lines(summary["gpus"], width), *fit(_node_line(summary), width, len("Node: ")),
        *run_by_run.runs_lines(report, width),
        *_problem_lines(summary["service_checks_not_ok"], len(report["service_checks"]), width),
        *run_by_run.change_lines(report, width),
        *run_by_run.event_lines(report, width),
        *_workload_lines(summary["workloads"]),
        *_idle_lines(summary["idle_workloads"], width),
        *_application_xid_lines(summary["application_xids"], width),
    ]


# --- data --------------------------------------------------------------------------------


def _gpus(metrics: List[dict], service_checks: List[dict]) -> List[dict]:
    """A row per GPU that has a health check (every GPU NVML sees), in index order."""
    columns = {name: _per_gpu(metrics, name)
               for name in (UTILIZATION_GPU, MEMORY_USED, MEMORY_TOTAL, COST_HOURLY, COST_IDLE_HOURLY)}
    rows = []
    for index, (device, status) in sorted(_gpu_health(service_checks).items(), key=_by_index):
        row = {"gpu_index": index, "device": device, "health": status, "held_by": _holders(metrics, index)}
        row.update({name.replace(".", "_"): values.get(index) for name, values in columns.items()})
        rows.append(row)
    return rows


def _workloads(metrics: List[dict]) -> List[dict]:
    """GPUs held, cost and idle cost per workload, over every GPU and MIG instance it holds."""
    totals: Dict[str, List[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for position, name in enumerate((WORKLOAD_GPUS, WORKLOAD_COST_HOURLY, WORKLOAD_COST_IDLE_HOURLY)):
        for series in _series(metrics, name):
            totals[_who(_tags(series))][position] += series["value"]
    return [{"workload": who, "gpus": gpus, "cost_hourly": hourly, "cost_idle_hourly": idle}
            for who, (gpus, hourly, idle) in sorted(totals.items()) if hourly or idle]


_CPU_FIGURES = {WORKLOAD_CPU_THROTTLED: "cpu_throttled", WORKLOAD_CPU_USAGE: "cpu_usage"}


def _idle_workloads(metrics: List[dict]) -> List[dict]:
    """Each workload idle or below effective_threshold, by reason: the GPUs it holds so, and its CPU figures."""
    figures = {name: _by_series(metrics, name) for name in (WORKLOAD_GPUS, *_CPU_FIGURES)}
    rows: Dict[Tuple[str, str, bool], Dict[str, Any]] = {}
    for series in _series(metrics, WORKLOAD_IDLE):
        tags = _tags(series)
        if "idle_reason" not in tags:
            continue
        key = tuple(t for t in series["tags"] if not t.startswith("idle_reason:"))
        row = rows.setdefault((_who(tags), tags["idle_reason"], bool(series["value"])),
                              {"gpus": 0.0, "cpu_throttled": None, "cpu_usage": None})
        row["gpus"] += figures[WORKLOAD_GPUS].get(key, 0.0)
        for name, field in _CPU_FIGURES.items():
            if key in figures[name]:
                row[field] = figures[name][key]
    return [dict(row, workload=who, reason=reason, idle=idle) for (who, reason, idle), row in sorted(rows.items())]


def _by_series(metrics: List[dict], name: str) -> Dict[Tuple[str, ...], float]:
    return {tuple(series["tags"]): series["value"] for series in _series(metrics, name)}


def _application_xids(xids: List[dict]) -> List[dict]:
    """Application XIDs (the workload's fault, not the GPU's) of every run, per workload and code: the
    kernel's log names the process each hit."""
    totals: Dict[Tuple[str, str, str], float] = defaultdict(float)
    for series in xids:
        tags = _tags(series)
        if tags.get("xid_origin") == "application":
            totals[(_hit(tags), tags.get("xid", "?"), tags.get("gpu_index", "?"))] += series["value"]
    return [{"workload": who, "xid": code, "gpu_index": index, "count": count}
            for (who, code, index), count in sorted(totals.items())]


def _hit(tags: Dict[str, str]) -> str:
    """Whose process an XID hit: its workload, else the name the driver gave it, else unknown."""
    if {"pod_name", "slurm_job_id", "container_id"} & set(tags):
        return _who(tags)
    return f"process {tags['process_name']}" if "process_name" in tags else "unknown process"


def _holders(metrics: List[dict], index: str) -> List[str]:
    # A container using a GPU it was not given is a workload holding none of it.
    return sorted({_who(_tags(series)) for series in _series(metrics, WORKLOAD_GPUS)
                   if _tags(series).get("gpu_index") == index and series["value"] > 0})


def _gpu_health(service_checks: List[dict]) -> Dict[str, Tuple[str, str]]:
    found = {}
    for check in service_checks:
        tags = _tags(check)
        if check["name"] == NAMESPACE + "device.health" and "gpu_index" in tags:
            found[tags["gpu_index"]] = (tags.get("gpu_device", "?"), check["status"])
    return found


def _who(tags: Dict[str, str]) -> str:
    if "pod_name" in tags:
        return f"{tags.get('kube_namespace', '?')}/{tags['pod_name']}"
    if "slurm_job_id" in tags:
        name = tags.get("slurm_job_name")
        return f"slurm job {tags['slurm_job_id']}" + (f" ({name})" if name else "")
    if "container_id" in tags:
        return f"container {tags['container_id'][:12]}"
    return "host processes"  # off Kubernetes, processes in no container or job


def _per_gpu(metrics: List[dict], name: str) -> Dict[str, float]:
    """A device metric's whole-GPU series by GPU index (MIG instances left out)."""
    return {
        tags["gpu_index"]: series["value"]
        for series, tags in ((s, _tags(s)) for s in _series(metrics, name))
        if "gpu_index" in tags and "gpu_instance_id" not in tags
    }


def activity_sources(metrics: List[dict]) -> Dict[str, float]:
    """How many GPUs each activity source judges (`activity_source` on the funnel's total)."""
    found: Dict[str, float] = defaultdict(float)
    for series in _series(metrics, FLEET_DEVICES_TOTAL):
        source = _tags(series).get("activity_source")
        if source is not None:
            found[source] += series["value"]
    return dict(found)


def _gpm_restarting(runs: List[dict]) -> int:
    """How many GPUs GPM judged the run before and not the last, whose counters started again in between:
    GPM gives the averages between two samples (nvml.h, nvmlGpmMetricsGet), and a driver reload loses the
    earlier one, so the first run after it takes a sample and nothing more. The run cannot take both: NVML
    wants them over 100 ms apart ("due to the internal sample refresh rate", NVML API reference, GPM
    Functions)."""
    if len(runs) < 2 or not runs[-1]["counters_restarted"]:
        return 0
    lost = runs[-2]["activity_sources"].get("gpm", 0) - runs[-1]["activity_sources"].get("gpm", 0)
    return int(min(max(lost, 0), len(runs[-1]["counters_restarted"])))


def _total(metrics: List[dict], name: str) -> Optional[float]:
    """The sum of a metric's series; None where the run sent none."""
    values = [series["value"] for series in _series(metrics, name)]
    return sum(values) if values else None


def _series(metrics: List[dict], name: str) -> List[dict]:
    return [m for m in metrics if m["name"] == NAMESPACE + name]


def _tags(item: dict) -> Dict[str, str]:
    return tag_dict(item["tags"])


def _by_index(item: Tuple[str, tuple]) -> Tuple[int, str]:
    index = item[0]
    return (int(index), index) if index.isdigit() else (1 << 30, index)


# --- text --------------------------------------------------------------------------------

# Who holds a GPU is the one column of free text: the last, where it can go on below. Each other column
# is as wide as its widest cell, and the device, the same on most nodes, is said once above the table.
_GPU_COLUMNS = (("gpu", "<"), ("device", "<"), ("util", ">"), ("memory", ">"), ("health", "<"), ("cost", ">"),
                ("idle cost", ">"))
# The index sits one space from the utilization, right-aligned after it; other columns two apart.
_NARROW_GAP_AFTER = ("gpu",)
_HOLDER_HEADER = "held by"
# Holders too long for the room right of the columns go under the row, from here.
_UNDER_ROW = "    held by "
_WORKLOAD_ROW = "{:<40} {:>6} {:>9} {:>9}"
_PROBLEM_ROW = "{:<22} {:<9} {:<7} {}"
_MESSAGE_INDENT = 22 + 1 + 9 + 1 + 7 + 1


def _gpu_lines(gpus: List[dict], width: Optional[int]) -> List[str]:
    """The table of GPUs: at `width` a row keeps to one line where its holders fit beside it, two
    holders that do not take a line each, and a holder longer than the room goes on a line under the row."""
    lines = [f"=== GPUs ({len(gpus)}) ==="]
    models = {gpu["device"] for gpu in gpus}
    columns = [name for name, _ in _GPU_COLUMNS if name != "device" or len(models) > 1]
    if len(models) == 1:
        lines.append(f"device of every GPU: {next(iter(models))}")
    rows = [_gpu_cells(gpu) for gpu in gpus]
    widths = {name: max([len(name)] + [len(row[name]) for row in rows]) for name in columns}
    align, gaps = dict(_GPU_COLUMNS), {name: 1 if name in _NARROW_GAP_AFTER else 2 for name in columns}

    def line(cells: Dict[str, str], holders: str) -> str:
        text = "".join(f"{cells[name]:{align[name]}{widths[name]}}" + " " * gaps[name] for name in columns)
        return (text + holders).rstrip()

    indent = sum(widths[name] + gaps[name] for name in columns)
    lines.append(line({name: name for name in columns}, _HOLDER_HEADER))
    room = None if width is None else width - indent
    for gpu, cells in zip(gpus, rows):
        held = _holder_cells(gpu["held_by"], room)
        if room is not None and max(map(len, held)) > room:
            lines.append(line(cells, ""))
            lines += fit(_UNDER_ROW + _holder_text(gpu["held_by"]), width, len(_UNDER_ROW))
            continue
        lines.append(line(cells, held[0]))
        lines += [" " * indent + more for more in held[1:]]
    return lines


def _gpu_cells(gpu: dict) -> Dict[str, str]:
    return {"gpu": gpu["gpu_index"], "device": gpu["device"], "util": human(UTILIZATION_GPU, gpu["utilization_gpu"]),
            "memory": _memory(gpu["memory_used"], gpu["memory_total"]), "health": gpu["health"],
            "cost": _money(gpu["cost_hourly"]), "idle cost": _money(gpu["cost_idle_hourly"])}


def _holder_cells(holders: List[str], room: Optional[int]) -> List[str]:
    """Who holds a GPU, on one line where it fits `room`, else a holder a line (each but the last with its comma)."""
    text = _holder_text(holders)
    if room is None or len(text) <= room or len(holders) < 2 or len(holders) > MAX_HOLDERS_NAMED:
        return [text]
    return [holder + "," for holder in holders[:-1]] + holders[-1:]


def _node_line(summary: Summary) -> str:
    funnel = {stage: "-" if value is None else f"{value:.0f}" for stage, value in summary["funnel"].items()}
    unusable = summary["unusable"] or 0
    usable = f"{funnel['total']} of {summary['funnel']['total'] + unusable:.0f} GPUs usable" if unusable else \
        f"{funnel['total']} GPUs"
    counts = (f"{usable}: {funnel['allocated']} allocated, {funnel['active']} active, "
              f"{funnel['effective']} effective{_basis(summary['activity_sources'], summary['gpm_restarting'])}")
    cost = summary["cost"]
    if cost["hourly"] is None:
        return f"Node: {counts}; {NO_PRICE}"
    unallocated = cost["unallocated_hourly"]
    line = f"Node: {counts}; cost {_money(cost['hourly'])}, idle {_money(cost['idle_hourly'])}"
    if unallocated:
        line += f" (unallocated {_money(unallocated)})"
    if unusable:
        line += f"; unusable {_money(cost['unusable_hourly'])}"
    return line


def _basis(sources: Dict[str, float], gpm_restarting: int) -> str:
    """What the active and effective counts rest on, by how many GPUs: `(activity: dcgm 8)`; and why GPUs
    GPM judged the run before rest on another this run."""
    if not sources:
        return ""
    basis = ", ".join(f"{source} {count:.0f}" for source, count in sorted(sources.items()))
    if gpm_restarting:
        basis += f"; GPM restarts after the driver reload and measures {_gpus_text(gpm_restarting)} again next run"
    return f" (activity: {basis})"


def _gpus_text(count: int) -> str:
    return "1 GPU" if count == 1 else f"{count} GPUs"


def _problem_lines(problems: List[dict], count: int, width: Optional[int]) -> List[str]:
    if not problems:
        return [f"\n=== Service checks: all {count} OK ===" if count else "\n=== Service checks: none sent ==="]
    lines = [f"\n=== Service checks not OK ({len(problems)} of {count}) ==="]
    for check in problems:
        row = _PROBLEM_ROW.format(check["name"][len(NAMESPACE):], check["status"], where(check), check["message"])
        lines += fit(row, width, _MESSAGE_INDENT)
    return lines


def _workload_lines(workloads: List[dict]) -> List[str]:
    if not workloads:
        return []
    rows = [_WORKLOAD_ROW.format(w["workload"], f"{w['gpus']:.3g}", _money(w["cost_hourly"]),
                                 _money(w["cost_idle_hourly"]))
            for w in workloads]
    header = _WORKLOAD_ROW.format("workload", "GPUs", "cost", "idle cost")
    return [f"\n=== Workload cost ({len(workloads)}) ===", header, *rows]


# What each idle reason means, in the words of the one line a workload gets.
_REASON_TEXT = {
    "no_process": "holds it and runs no process on it",
    "cpu_throttled": "its CPU is throttled",
    "cpu_saturated": "its CPU is saturated",
    "io_wait": "its processes stall on IO (PSI)",
    "memory_pressure": "its processes stall on memory (PSI)",
    "zombie": "processes whose owner is gone hold memory on its GPU",
    "unknown": "its processes and cgroup show no cause",
}


def _idle_lines(rows: List[dict], width: Optional[int]) -> List[str]:
    if not rows:
        return []
    lines = [f"\n=== Why held GPUs idle ({len(rows)}) ==="]
    for row in rows:
        state = "idle" if row["idle"] else "below threshold"
        lines += fit(f"{row['workload']:<40} {row['gpus']:>5.3g} GPU  {state:<15}  {row['reason']}: "
                     f"{_reason_text(row)}", width, 40 + 1 + 5 + 6 + 15 + 2)
    return lines


def _reason_text(row: dict) -> str:
    text = _REASON_TEXT.get(row["reason"], row["reason"])
    if row["reason"] == "cpu_throttled" and row["cpu_throttled"] is not None:
        text = f"throttled in {row['cpu_throttled']:.0f} % of CPU periods"
    if row["reason"] in ("cpu_throttled", "cpu_saturated") and row["cpu_usage"] is not None:
        text += f" at {row['cpu_usage']:.1f} cores"
    return text


def _application_xid_lines(xids: List[dict], width: Optional[int]) -> List[str]:
    if not xids:
        return []
    lines = [f"\n=== Application XIDs per workload ({len(xids)}) ==="]
    for row in xids:
        lines += fit(f"{row['workload']}: XID {row['xid']} × {row['count']:,.0f} on GPU {row['gpu_index']}", width, 2)
    return lines


def _holder_text(holders: List[str]) -> str:
    if len(holders) > MAX_HOLDERS_NAMED:
        return f"{len(holders)} workloads"
    return ", ".join(holders) or "-"


def _memory(used: Optional[float], total: Optional[float]) -> str:
    # The total as memory.total's series shows it (79.6 GiB of an "80GB" board), not rounded to the board's size.
    return f"{used / GIB:.1f}/{total / GIB:.1f} GiB" if used is not None and total else "-"


def _money(value: Optional[float]) -> str:
    return "-" if value is None else f"${value:,.2f}/h"
