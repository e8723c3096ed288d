"""Every series and service check of the last check run, and every run's events, one per line, values
in human units and every tag: what `gpu-monitoring check --series` prints after the summary."""

from typing import Any, Dict, List, Optional

from gpu_monitoring.cli.run_by_run import several_runs
from gpu_monitoring.cli.wrapping import LEAST_ROOM, fit
from gpu_monitoring.metrics.units import human

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
        lines += tagged(f"{m['name']:<58} {m['type']:<16} {human(m['name'], m['value']):>14}", m["tags"], width)
    lines.append(f"\n--- Service checks ({len(checks)}) ---")
    for s in checks:
        lines += tagged(f"{s['name']:<40} {s['status']:<9} {s['message']}", s["tags"], width)
    lines.append(f"\n--- Events ({len(events)}{runs}) ---")
    for event in events:
        run = f"run {event['run']}: " if runs else ""
        lines += tagged(f"[{event['alert_type']}] {run}{event['title']}", event["tags"], width)
        for line in event["text"].splitlines():
            if line.strip():
                lines += fit(f"{' ' * INDENT}{line.rstrip()}", width, 2 * INDENT)
    return lines


def tagged(head: str, tags: List[str], width: Optional[int]) -> List[str]:
    """`head`, then every tag, comma-joined as DogStatsD sends them, so that a series is told from its
    neighbours (a port, a throttle reason) by what tells it apart in Datadog. Unwrapped, the tags are the
    line's last word; a line too wide breaks between tags, after a comma, and goes on indented as `fit`
    indents, so that a tag is never cut and the lines rejoin to the list as sent."""
    head = head.rstrip()
    line = f"{head}  {','.join(tags)}" if tags else head
    if width is None or len(line) <= width:
        return [line]
    lines = fit(head, width, INDENT)
    hanging = " " * max(0, min(INDENT, width - LEAST_ROOM))
    current, gap = lines.pop(), "  "
    for i, tag in enumerate(tags):
        word = tag if i == len(tags) - 1 else tag + ","
        if current.strip() and len(current) + len(gap) + len(word) > width:
            lines.append(current)
            current, gap = hanging, ""
        current, gap = current + gap + word, ""
    return [*lines, current]
