"""Section 5's tables from the memory figures of each mode."""

from typing import List

from .memory import MemoryFigures, Site
from .report import Report, Section, Table


def section(modes: List[MemoryFigures], report: Report) -> Section:
    tables: List[Table] = []
    for figures in modes:
        report.headline["memory_runs"] = figures.runs
        report.headline[f"{figures.mode}_mode_check_rss_mib"] = list(figures.rss.values())[-1]
        if figures.sidecar_rss:
            report.headline["sidecar_rss_mib"] = list(figures.sidecar_rss.values())[-1]
        tables += [_rss(figures), _churn(figures)]
        tables += [
            _sites(f"{figures.mode}: top {len(figures.top_warm)} allocation sites after {figures.warm_up} runs",
                   figures.top_warm, "KiB live"),
            _sites(f"{figures.mode}: top allocation sites after {figures.warm_up + figures.traced} runs",
                   figures.top_traced, "KiB live"),
            _sites(f"{figures.mode}: growth over the {figures.traced} traced runs", figures.growth_per_1000,
                   "KiB per 1,000 runs"),
        ]
    return Section(
        "5. Memory (dgx-h100)",
        tables,
        ["tracemalloc sites: gpu_monitoring/ (not the simulator) and datadog_checks/; tracemalloc runs from",
         "before the check is built through the traced runs (it slows a run about fivefold), then stops;",
         "RSS growth and GC figures come from the untraced runs after it. Sidecar mode: a real sidecar",
         "subprocess serves the snapshots over its unix socket, one snapshot per run."],
    )


def _rss(figures: MemoryFigures) -> Table:
    rows = [[f"check process {when}", mib] for when, mib in figures.rss.items()]
    rows += [[f"sidecar process {when}", mib] for when, mib in figures.sidecar_rss.items()]
    notes = [f"check process RSS growth per 1,000 untraced runs: {figures.rss_growth_per_1000:.3f} MiB"]
    if figures.sidecar_rss:
        values = list(figures.sidecar_rss.values())
        notes.append(f"sidecar RSS growth per 1,000 snapshots after warm-up: "
                     f"{(values[-1] - values[0]) * 1000 / max(figures.runs - figures.warm_up, 1):.3f} MiB")
    if figures.failed_runs:
        notes.append(f"runs that failed: {figures.failed_runs}")
    return Table(f"{figures.mode} mode: RSS over {figures.runs} runs", ["process, when", "VmRSS MiB"], rows, notes)


def _churn(figures: MemoryFigures) -> Table:
    rows = [[name, value] for name, value in figures.gc_per_run.items()]
    rows.append(["tracemalloc peak above the run's start, KiB (median of traced runs)", figures.peak_kib_per_run])
    return Table(f"{figures.mode} mode: allocation churn and GC per run", ["figure", "per run"], rows)


def _sites(title: str, sites: List[Site], unit: str) -> Table:
    return Table(title, ["site", unit, "blocks"], [[s.where, s.kib, s.count] for s in sites])
