"""Section 3: where a steady-state run spends its time, by stage, by function and by whose code it is."""

from . import stages
from .harness import Bench, per
from .profiling import group_of, label, profile, shares, top
from .report import Section, Table

TOP = 25


def section(scenario: str, runs: int, rounds: int) -> Section:
    with Bench(scenario) as bench:
        bench.warm_up(2)
        stats = profile(bench, runs).stats
    by_group = shares(stats)
    total = sum(by_group.values())
    groups = Table(
        "Own time (tottime) by group",
        ["group", "ms/run", "share"],
        [[name, seconds * 1000 / runs, f"{per(seconds, total):.1%}"]
         for name, seconds in sorted(by_group.items(), key=lambda kv: -kv[1])],
        ["check: gpu_monitoring/ less simulator/; simulated driver: gpu_monitoring/simulator/;",
         "C builtins: functions written in C (str, dict, ctypes...), whoever calls them"],
    )
    functions = Table(
        f"Top {TOP} functions by own time",
        ["function", "group", "calls/run", "own ms/run", "cum ms/run", "share"],
        [[label(key), group_of(key), calls / runs, tottime * 1000 / runs, cumtime * 1000 / runs,
          f"{per(tottime, total):.1%}"]
         for key, calls, tottime, cumtime in top(stats, TOP)],
    )
    return Section(
        f"3. Profile: {scenario}, its stages, and {runs} steady-state runs under cProfile",
        [stages.table(scenario, rounds), groups, functions],
        ["times are cProfile's, inflated by its overhead on each call: compare shares, not milliseconds"],
    )
