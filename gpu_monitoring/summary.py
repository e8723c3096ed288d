"""What `gpu-monitoring check` prints after the series for a person to read: a line per GPU with
its load, health, holder and what it costs, the node's funnel and cost, and each workload's cost.

It reads only the report of what the check submitted, so it shows what Datadog would receive.
"""

from collections import defaultdict
from typing import Dict, List, Optional, Tuple

NAMESPACE = "gpu_monitoring."
GIB = 1024 ** 3
FUNNEL = ("total", "allocated", "active", "effective")
NO_PRICE = "no price for these GPUs: set hourly_price or default_hourly_price to see cost"


def summary_lines(report: Dict[str, list]) -> List[str]:
    metrics = report["metrics"]
    return [*_gpu_section(metrics, report["service_checks"]), _node_line(metrics), *_workload_section(metrics)]


_GPU_HEADER = ("gpu", "device", "util", "memory", "health", "held by", "cost", "idle cost")
_GPU_ROW = "{:<4} {:<24} {:>5} {:>17}  {:<9} {:<40} {:>9} {:>9}"
_GPU_COLUMNS = ("utilization.gpu", "memory.used", "memory.total", "cost.hourly", "cost.idle_hourly")
_WORKLOAD_ROW = "{:<48} {:>6} {:>9} {:>9}"


def _gpu_section(metrics: List[dict], service_checks: List[dict]) -> List[str]:
    gpus = _gpu_health(service_checks)
    columns = {name: _per_gpu(metrics, name) for name in _GPU_COLUMNS}
    rows = [_gpu_row(index, device, status, columns, _holders(metrics, index))
            for index, (device, status) in sorted(gpus.items(), key=_by_index)]
    return [f"=== GPUs ({len(gpus)}) ===", _GPU_ROW.format(*_GPU_HEADER), *rows]


def _gpu_row(index: str, device: str, status: str, columns: Dict[str, Dict[str, float]], holders: str) -> str:
    util = columns["utilization.gpu"].get(index)
    used, total = columns["memory.used"].get(index), columns["memory.total"].get(index)
    memory = f"{used / GIB:.1f}/{total / GIB:.0f} GiB" if used is not None and total else "-"
    return _GPU_ROW.format(
        index, device, "-" if util is None else f"{util:.0f}%", memory, status, holders,
        _money(columns["cost.hourly"].get(index)), _money(columns["cost.idle_hourly"].get(index)),
    )


def _workload_section(metrics: List[dict]) -> List[str]:
    costs = _workload_costs(metrics)
    if not costs:
        return []
    rows = [_WORKLOAD_ROW.format(who, f"{gpus:.3g}", _money(hourly), _money(idle))
            for who, (gpus, hourly, idle) in sorted(costs.items())]
    return [f"\n=== Workload cost ({len(costs)}) ===", _WORKLOAD_ROW.format("workload", "GPUs", "cost", "idle cost"),
            *rows]


def _node_line(metrics: List[dict]) -> str:
    funnel = {stage: sum(_values(metrics, f"fleet.devices.{stage}")) for stage in FUNNEL}
    counts = (f"{funnel['total']:.0f} GPUs: {funnel['allocated']:.0f} allocated, {funnel['active']:.0f} active, "
              f"{funnel['effective']:.0f} effective")
    hourly, idle = _values(metrics, "cost.hourly"), _values(metrics, "cost.idle_hourly")
    if not hourly:
        return f"Node: {counts}; {NO_PRICE}"
    return f"Node: {counts}; cost {_money(sum(hourly))}, idle {_money(sum(idle))}"


def _workload_costs(metrics: List[dict]) -> Dict[str, Tuple[float, float, float]]:
    """(GPUs held, cost, idle cost) per workload, over every GPU and MIG instance it holds."""
    totals: Dict[str, List[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for position, name in enumerate(("workload.gpus", "workload.cost.hourly", "workload.cost.idle_hourly")):
        for series in _series(metrics, name):
            totals[_who(_tags(series))][position] += series["value"]
    return {who: tuple(values) for who, values in totals.items() if values[1] or values[2]}


def _holders(metrics: List[dict], index: str) -> str:
    # A container using a GPU it was not given is a workload holding none of it.
    who = sorted({_who(_tags(series)) for series in _series(metrics, "workload.gpus")
                  if _tags(series).get("gpu_index") == index and series["value"] > 0})
    if len(who) > 2:
        return f"{len(who)} workloads"
    return ", ".join(who) or "-"


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
    return f"container {tags.get('container_id', '?')[:12]}"


def _per_gpu(metrics: List[dict], name: str) -> Dict[str, float]:
    """A device metric's whole-GPU series by GPU index (MIG instances left out)."""
    return {
        tags["gpu_index"]: series["value"]
        for series, tags in ((s, _tags(s)) for s in _series(metrics, name))
        if "gpu_index" in tags and "gpu_instance_id" not in tags
    }


def _values(metrics: List[dict], name: str) -> List[float]:
    return [series["value"] for series in _series(metrics, name)]


def _series(metrics: List[dict], name: str) -> List[dict]:
    return [m for m in metrics if m["name"] == NAMESPACE + name]


def _tags(item: dict) -> Dict[str, str]:
    return dict(tag.split(":", 1) for tag in item["tags"] if ":" in tag)


def _money(value: Optional[float]) -> str:
    return "-" if value is None else f"${value:,.2f}/h"


def _by_index(item: Tuple[str, tuple]) -> Tuple[int, str]:
    index = item[0]
    return (int(index), index) if index.isdigit() else (1 << 30, index)
