"""Every series and service check of the last check run, and every run's events, one per line, values
in human units: what `gpu-monitoring check --series` prints after the summary."""

from typing import Any, Dict, List, Optional

from gpu_monitoring.cli.run_by_run import several_runs
from gpu_monitoring.cli.wrapping import fit
from gpu_monitoring.metrics.units import human

# Enough tags to tell one series from another: the GPU or MIG instance, the XID, and the
# workload (pod, Slurm job) or process that holds it. A mode is worth showing only where a GPU
# is sliced or shared.
SHORT_TAGS = ("gpu_index:", "gpu_instance_id:", "gpu_mig_profile:", "gpu_slicing_mode:", "gpu_sharing_mode:", "xid:",
              "kube_namespace:", "pod_name:", "slurm_job_id:", "slurm_job_name:", "pid:", "process_name:")
# A series' name and value start a line; what does not fit goes on below, indented.
INDENT = 4


def series_lines(report: Dict[str, Any], width: Optional[int] = None) -> List[str]:
    """The listing, each line fitted to `width` columns (none: as long as it is)."""
    metrics, checks, events = report["metrics"], report["service_checks"], report["events"]
    runs = f" of {len(report['runs'])} runs" if several_runs(report) else ""
    lines = fit(f"=== Series sent to Datadog: {len(metrics)} metrics, {len(checks)} service checks, "
                f"{len(events)} events{runs} ===", width, INDENT)
    lines.append(f"--- Metrics ({len(metrics)}) ---")
    for m in metrics:
        lines += fit(f"{m['name']:<58} {m['type']:<16} {human(m['name'], m['value']):>14}  {short_tags(m['tags'])}",
                     width, INDENT)
    lines.append(f"\n--- Service checks ({len(checks)}) ---")
    for s in checks:
        lines += fit(f"{s['name']:<40} {s['status']:<9} {short_tags(s['tags']):<40} {s['message']}".rstrip(),
                     width, INDENT)
    lines.append(f"\n--- Events ({len(events)}{runs}) ---")
    for event in events:
        run = f"run {event['run']}: " if runs else ""
        lines += fit(f"[{event['alert_type']}] {run}{event['title']}  {short_tags(event['tags'])}", width, INDENT)
        for line in event["text"].splitlines():
            if line.strip():
                lines += fit(f"{' ' * INDENT}{line}", width, 2 * INDENT)
    return lines


def short_tags(tags: List[str]) -> str:
    return ",".join(t for t in tags if t.startswith(SHORT_TAGS) and not t.endswith("_mode:none"))
