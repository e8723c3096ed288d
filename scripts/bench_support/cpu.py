"""Section 2: the check's CPU per series against the submission floor, and the cost of field entries."""

from dataclasses import dataclass
from typing import List, Tuple

from .entry import entry
from .floor import FloorComparison
from .harness import Bench, per
from .profiling import cumulative, own_time, profile
from .report import HEADLINE_SCENARIO, Report, Section, Table

# The check's own CPU per series, in floors, where every series it knows is sent (`metrics_profile: full`):
# a smaller profile sends fewer series for much the same reads, so its ratio is shown, not targeted.
FLOOR_LIMIT = 1.5


# Where the check handles a batch of field values, newest layout first: the first one the profile
# holds is measured (the code moves; the figure follows it).
FIELD_HANDLERS = [("gpu_monitoring/nvml/fields.py", "read"), ("gpu_monitoring/nvml/fields.py", "request"),
                  ("gpu_monitoring/nvml/device.py", "field_values")]


@dataclass
class FieldCost:
    handler: str  # the function measured
    entries_per_run: float
    profiled_us: float  # per entry, under cProfile
    share: float  # of the check's own CPU under cProfile
    estimated_us: float  # per entry, scaled to the unprofiled CPU


def field_cost(scenario: str, runs: int, own_ms: float) -> FieldCost:
    """The check's own handling of field entries: cProfile's cumulative time of the function that
    asks for and reads back a device's batch, less the simulated driver's time answering it."""
    with Bench(scenario) as bench:
        bench.warm_up(2)
        profiled = profile(bench, runs)
    stats = profiled.stats
    found = [(f"{path}:{name}", cumulative(stats, path, name)) for path, name in FIELD_HANDLERS]
    handler, inside = next(((h, t) for h, t in found if t > 0), ("(no field handler in the profile)", 0.0))
    handling = max(inside - profiled.field_driver_seconds, 0.0)
    entries_per_run = per(profiled.field_entries, runs)
    share = per(handling, own_time(stats))
    return FieldCost(
        handler=handler,
        entries_per_run=entries_per_run,
        profiled_us=per(handling, profiled.field_entries) * 1e6,
        share=share,
        estimated_us=per(share * own_ms * 1000, entries_per_run),
    )


def section(comparisons: List[Tuple[str, FloorComparison]], fields: Tuple[str, FieldCost], report: Report,
            targeted: str) -> Section:
    rounds = comparisons[0][1].rounds if comparisons else 0
    table = Table(
        f"CPU per run, median of {rounds} interleaved rounds (ms of the check's thread)",
        ["scenario", "series/run", "floor ms", "check ms", "of which sim. driver", "check own ms",
         "own/floor per series", "with sim. entry", "with driver", f"target <= {FLOOR_LIMIT}"],
    )
    for label, c in comparisons:
        verdict = "-"
        if label == targeted:
            verdict = report.target(f"CPU per series over the floor, {label}", c.ratio_own, f"<= {FLOOR_LIMIT}",
                                    c.ratio_own <= FLOOR_LIMIT)
        table.rows.append([label, c.series, c.floor_ms, c.cpu_ms, c.cpu_ms - c.own_ms, c.own_ms,
                           c.ratio_own, c.ratio_own_and_entry, c.ratio_with_driver, verdict])
        if label == HEADLINE_SCENARIO:
            report.headline.update(series_per_run=c.series, own_ms_per_run=c.own_ms, floor_ms_per_run=c.floor_ms,
                                   own_over_floor=c.ratio_own)
    calibrated = entry()
    table.notes += [
        "`of which sim. driver`: the CPU inside the simulated NVML functions, plus "
        f"{calibrated.excess_us:.2f} µs a call: a call into",
        f"the simulator costs the calling thread {calibrated.simulated_us:.2f} µs outside the simulator's own "
        "timing (ctypes' way into a Python",
        f"callback and out), one into a C function of the same shape {calibrated.c_us:.2f} µs "
        "(scripts/bench_support/entry.py).",
        "`with sim. entry` counts that difference as the check's instead.",
        "Headline: `own/floor per series` = the check's own CPU per series (the simulated driver excluded) over",
        "the floor's, an AgentCheck that submits the same series as gauges into the same aggregator. The simulated",
        "driver is Python, far costlier than libnvidia-ml; on a GPU node the real driver adds its own time inside",
        "the NVML calls of section 1, which this machine cannot measure. pynvml's ctypes work counts as the check's.",
        "Both pay the test stub aggregator (datadog_checks.base.stubs) per series, where the Agent calls native",
        "code: that raises the floor, so under the Agent the same work would be a larger multiple of it.",
    ]
    label, cost = fields
    field_table = Table(
        f"Field entries ({label})",
        ["entries/run", "µs/entry under cProfile", "share of own CPU", "µs/entry, estimated unprofiled"],
        [[cost.entries_per_run, cost.profiled_us, f"{cost.share:.1%}", cost.estimated_us]],
        [f"cumulative time of {cost.handler} under cProfile, less the simulated nvmlDeviceGetFieldValues in it;",
         "the estimate scales its share of the profiled own CPU to the unprofiled own CPU per run"],
    )
    return Section("2. CPU per series against the submission floor", [table, field_table])
