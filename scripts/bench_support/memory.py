"""Memory over many runs: RSS, tracemalloc's allocation sites and their growth, allocation churn and GC.

tracemalloc runs from before the check is built, so the sites after warm-up show where the
check's memory lives. It slows a run about fivefold, so it traces the warm-up and the next
`traced` runs only; the runs after those go untraced and give RSS growth and GC figures.
"""

import gc
import os
import statistics
import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from sidecar_bench import rss_mib

from .paths import short_path

TOP = 10
# The check's code and the base class's; the simulator stands in for the driver, not the check.
SITES = [
    tracemalloc.Filter(True, "*/gpu_monitoring/*"),
    tracemalloc.Filter(True, "*/datadog_checks/*"),
    tracemalloc.Filter(False, "*/gpu_monitoring/simulator/*"),
]


@dataclass
class Site:
    where: str
    kib: float
    count: int


@dataclass
class MemoryFigures:
    mode: str
    warm_up: int
    traced: int
    runs: int
    rss: Dict[str, float] = field(default_factory=dict)  # when -> MiB, this process
    sidecar_rss: Dict[str, float] = field(default_factory=dict)  # when -> MiB, the sidecar's
    rss_growth_per_1000: float = 0.0  # MiB, over the untraced runs
    top_warm: List[Site] = field(default_factory=list)
    top_traced: List[Site] = field(default_factory=list)
    growth_per_1000: List[Site] = field(default_factory=list)  # KiB per 1,000 runs
    peak_kib_per_run: float = 0.0  # tracemalloc's peak above the run's start, median
    gc_per_run: Dict[str, float] = field(default_factory=dict)
    failed_runs: int = 0


class GcWatch:
    """Collections, objects collected and GC time, from `gc.callbacks`."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.collected = 0
        self.seconds = 0.0
        self._started = 0.0

    def __enter__(self) -> "GcWatch":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *_exc: Any) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: Dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
            return
        self.seconds += time.thread_time() - self._started
        self.collections[info["generation"]] += 1
        self.collected += info["collected"]

    def per_run(self, runs: int) -> Dict[str, float]:
        runs = max(runs, 1)
        found = {f"gen{g} collections": n / runs for g, n in enumerate(self.collections)}
        found["objects collected"] = self.collected / runs
        found["GC ms"] = self.seconds * 1000 / runs
        return found


def measure(mode: str, runner: Any, runs: int, traced: int, warm_up: int) -> MemoryFigures:
    """`runner` has `run()`, `failures`, and `sidecar_pid` (None in local mode); tracemalloc is
    already tracing when it is built."""
    traced = min(traced, max(runs - warm_up, 0))
    figures = MemoryFigures(mode, warm_up, traced, runs)
    _repeat(runner.run, warm_up)
    warm = _snapshot()
    _mark(figures, runner.sidecar_pid, f"after {warm_up} runs (warm-up)")
    figures.peak_kib_per_run = statistics.median([_peak_kib(runner.run) for _ in range(traced)] or [0.0])
    later = _snapshot()
    tracemalloc.stop()
    _mark(figures, runner.sidecar_pid, f"after {warm_up + traced} runs (traced)")
    untraced = runs - warm_up - traced
    started = rss_mib(os.getpid())
    with GcWatch() as watch:
        _repeat(runner.run, untraced)
    _mark(figures, runner.sidecar_pid, f"after {runs} runs")
    figures.rss_growth_per_1000 = (rss_mib(os.getpid()) - started) * 1000 / untraced if untraced else 0.0
    figures.gc_per_run = watch.per_run(untraced)
    figures.top_warm, figures.top_traced = _top(warm), _top(later)
    figures.growth_per_1000 = _growth(later, warm, traced)
    figures.failed_runs = runner.failures
    return figures


def _repeat(run: Callable[[], None], times: int) -> None:
    for _ in range(times):
        run()


def _peak_kib(run: Callable[[], None]) -> float:
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    run()
    return (tracemalloc.get_traced_memory()[1] - before) / 1024


def _mark(figures: MemoryFigures, sidecar_pid: Optional[int], when: str) -> None:
    figures.rss[when] = rss_mib(os.getpid())
    if sidecar_pid is not None:
        figures.sidecar_rss[when] = rss_mib(sidecar_pid)


def _snapshot() -> tracemalloc.Snapshot:
    return tracemalloc.take_snapshot().filter_traces(SITES)


def _top(snapshot: tracemalloc.Snapshot) -> List[Site]:
    return [_site(stat.traceback, stat.size / 1024, stat.count) for stat in snapshot.statistics("lineno")[:TOP]]


def _growth(later: tracemalloc.Snapshot, earlier: tracemalloc.Snapshot, runs: int) -> List[Site]:
    if not runs:
        return []
    diffs = sorted(later.compare_to(earlier, "lineno"), key=lambda d: -d.size_diff)[:TOP]
    return [_site(d.traceback, d.size_diff / 1024 * 1000 / runs, d.count_diff) for d in diffs]


def _site(traceback: tracemalloc.Traceback, kib: float, count: int) -> Site:
    frame = traceback[0]
    return Site(f"{short_path(frame.filename)}:{frame.lineno}", kib, count)
