"""Every series, service check and event of a check run, one per line, values in human units:
what `gpu-monitoring check --series` prints after the summary."""

from typing import Dict, List

from gpu_monitoring.metrics.units import human

# Enough tags to tell one series from another: the GPU or MIG instance, the XID, and the
# workload (pod, Slurm job) or process that holds it. A mode is worth showing only where a GPU
# is sliced or shared.
SHORT_TAGS = ("gpu_index:", "gpu_instance_id:", "gpu_mig_profile:", "gpu_slicing_mode:", "gpu_sharing_mode:", "xid:",
              "kube_namespace:", "pod_name:", "slurm_job_id:", "slurm_job_name:", "pid:", "process_name:")


def series_lines(report: Dict[str, list]) -> List[str]:
    metrics, checks, events = report["metrics"], report["service_checks"], report["events"]
    lines = [f"=== Series sent to Datadog: {len(metrics)} metrics, {len(checks)} service checks, "
             f"{len(events)} events ===", f"--- Metrics ({len(metrics)}) ---"]
    lines += [f"{m['name']:<58} {m['type']:<16} {human(m['name'], m['value']):>14}  {short_tags(m['tags'])}"
              for m in metrics]
    lines.append(f"\n--- Service checks ({len(checks)}) ---")
    lines += [f"{s['name']:<40} {s['status']:<9} {short_tags(s['tags']):<40} {s['message']}" for s in checks]
    lines.append(f"\n--- Events ({len(events)}) ---")
    for event in events:
        lines.append(f"[{event['alert_type']}] {event['title']}  {short_tags(event['tags'])}")
        lines += [f"    {line}" for line in event["text"].splitlines() if line.strip()]
    return lines


def short_tags(tags: List[str]) -> str:
    return ",".join(t for t in tags if t.startswith(SHORT_TAGS) and not t.endswith("_mode:none"))
