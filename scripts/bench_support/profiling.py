"""cProfile of steady-state runs, with each function put in the group whose code it is.

The profiler's timer is `time.thread_time`, CPU as everywhere else in the bench, so a wait on
the pod-resources socket is no hotspot. Each call costs the profiler more than its default
timer would, which weighs on the functions called most: read shares, not milliseconds.
"""

import cProfile
import pstats
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Tuple

from .harness import Bench
from .paths import STDLIB, short_path

FunctionKey = Tuple[str, int, str]  # pstats' (file, line, name)

# Most specific first: the simulator lives inside the package.
GROUPS: List[Tuple[str, str]] = [
    ("simulated driver", "/gpu_monitoring/simulator/"),
    ("check", "/gpu_monitoring/"),
    ("pynvml bindings", "/pynvml"),
    ("datadog_checks.base", "/datadog_checks/base/"),
]


@dataclass
class Profiled:
    stats: pstats.Stats
    runs: int
    field_entries: int
    field_driver_seconds: float  # inside the simulated nvmlDeviceGetFieldValues, profiler included


def profile(bench: Bench, runs: int) -> Profiled:
    """Profile `runs` steady runs of a warmed-up bench."""
    profiler = cProfile.Profile(time.thread_time)
    entries, driver = bench.fields.count, bench.fields.seconds
    for _ in range(runs):
        profiler.enable()
        bench.run()
        profiler.disable()
    return Profiled(pstats.Stats(profiler), runs, bench.fields.count - entries, bench.fields.seconds - driver)


def own_time(stats: pstats.Stats) -> float:
    """The profiled time outside the simulated driver: all of it less every simulated NVML call."""
    total = sum(tt for _cc, _nc, tt, _ct, _callers in stats.stats.values())
    return total - cumulative(stats, "gpu_monitoring/simulator/library.py", "call")


def group_of(key: FunctionKey) -> str:
    path = key[0]
    if path == "~":
        return "C builtins"
    if path.startswith("<frozen "):
        return "stdlib"
    for name, marker in GROUPS:
        if marker in path:
            return name
    if path.startswith(STDLIB) and "site-packages" not in path:
        return "stdlib"
    return "other packages"


def shares(stats: pstats.Stats) -> Dict[str, float]:
    """Own time (tottime) by group, in seconds."""
    found: Dict[str, float] = defaultdict(float)
    for key, (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        found[group_of(key)] += tottime
    return dict(found)


def top(stats: pstats.Stats, count: int) -> List[Tuple[FunctionKey, int, float, float]]:
    """(function, calls, tottime, cumtime) of the `count` functions with the most own time."""
    rows = [(key, nc, tt, ct) for key, (_cc, nc, tt, ct, _callers) in stats.stats.items()]
    return sorted(rows, key=lambda row: -row[2])[:count]


def cumulative(stats: pstats.Stats, path_end: str, name: str) -> float:
    """Cumulative time of the function `name` defined in a file whose path ends with `path_end`."""
    return sum(ct for (path, _line, fn), (_cc, _nc, _tt, ct, _callers) in stats.stats.items()
               if fn == name and path.endswith(path_end))


def label(key: FunctionKey) -> str:
    """`file:line(function)` with the file relative to the repository, site-packages or the stdlib."""
    path, line, name = key
    return name if path == "~" else f"{short_path(path)}:{line}({name})"
