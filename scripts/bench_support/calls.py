"""Section 1: NVML calls per GPU per steady-state run, by function, from the simulator's counter.

The target, at most CALLS_LIMIT a GPU, counts every call a run makes: the field fallbacks and the
GPU's share of the node's event drain included. It is set for the H100 and B200 nodes, with their
processes and in every metrics profile, and for the node whose driver refuses fields, where the
dedicated functions that read what a refused field would have given are counted apart (they are
that driver's price, up to one call per NVLink link and counter); the other nodes' figures are
printed for comparison.
"""

from collections import Counter
from dataclasses import dataclass
from typing import AbstractSet, Any, Dict, List, Set

from gpu_monitoring.collectors.inventory import PERSISTENCE_INTERVAL
from gpu_monitoring.collectors.mig import MIG_MODE_INTERVAL
from gpu_monitoring.nvml.fallbacks import FUNCTIONS as FALLBACKS

from .harness import INTERVAL, Bench
from .report import HEADLINE_SCENARIO, Report, Section, Table

CALLS_LIMIT = 20  # calls per GPU per run
# Made once a run for the whole node, however many GPUs it has (once more for each event found).
NODE_FUNCTIONS = {"nvmlEventSetWait_v2"}


@dataclass
class CallCount:
    label: str
    gpus: int
    per_gpu: Dict[str, float]  # function -> calls per GPU per run
    field_entries: float  # entries asked of nvmlDeviceGetFieldValues per run

    @property
    def total(self) -> float:
        return sum(self.per_gpu.values())

    @property
    def besides_fallbacks(self) -> float:
        return sum(n for name, n in self.per_gpu.items() if name not in FALLBACKS)

    @property
    def for_the_gpus(self) -> float:
        """Calls made of the GPUs, per GPU, besides fallbacks: what the target counts."""
        return self.besides_fallbacks - sum(self.per_gpu.get(name, 0.0) for name in NODE_FUNCTIONS)

    @property
    def node_calls_per_run(self) -> float:
        return sum(self.per_gpu.get(name, 0.0) for name in NODE_FUNCTIONS) * self.gpus


def count_calls(label: str, scenario: str, runs: int, **options: Any) -> CallCount:
    with Bench(scenario, **options) as bench:
        bench.warm_up(1)
        bench.sim.calls.clear()
        entries = bench.fields.count
        for _ in range(runs):
            bench.run()
        per_gpu = {name: n / runs / bench.gpus for name, n in bench.sim.calls.items()}
        return CallCount(label, bench.gpus, per_gpu, (bench.fields.count - entries) / runs)


def section(counts: List[CallCount], runs: int, report: Report, targeted: Set[str],
            fallbacks_apart: AbstractSet[str] = frozenset()) -> Section:
    """The table of `counts`; those labelled in `targeted` judged against CALLS_LIMIT on every call they
    make, or besides field fallbacks for those in `fallbacks_apart`."""
    functions = Counter()
    for count in counts:
        functions.update(count.per_gpu)
    table = Table(
        f"NVML calls per GPU per run, by function ({runs} runs after a warm-up run)",
        ["function"] + [c.label for c in counts],
        [[name] + [c.per_gpu.get(name, 0.0) for c in counts] for name, _ in functions.most_common()],
    )
    table.rows.append(["total per GPU"] + [c.total for c in counts])
    table.rows.append(["besides field fallbacks"] + [c.besides_fallbacks for c in counts])
    table.rows.append(["of the GPUs, besides fallbacks"] + [c.for_the_gpus for c in counts])
    table.rows.append(["the node's own, per run"] + [c.node_calls_per_run for c in counts])
    table.rows.append([f"target <= {CALLS_LIMIT} per GPU, every call"]
                      + [_verdict(c, report, targeted, fallbacks_apart) for c in counts])
    table.rows.append(["GPUs"] + [c.gpus for c in counts])
    table.rows.append(["field entries per run"] + [c.field_entries for c in counts])
    table.notes.append("field entries: the `count` of every nvmlDeviceGetFieldValues call, summed over a run")
    table.notes.append("field fallbacks: " + ", ".join(sorted(FALLBACKS)))
    table.notes.append("the node's own: " + ", ".join(sorted(NODE_FUNCTIONS)) + ", once a run for every GPU together "
                       "(the total per GPU counts its share)")
    table.notes.append(
        f"not in these runs, made back to back: what is asked on a timer, MIG mode of a GPU that lists processes every "
        f"{MIG_MODE_INTERVAL / 60:g} minutes and persistence mode every {PERSISTENCE_INTERVAL / 60:g}, "
        f"{INTERVAL / MIG_MODE_INTERVAL + INTERVAL / PERSISTENCE_INTERVAL:.3f} calls per GPU per {INTERVAL}-s run")
    table.notes.append("the target judges the total per GPU, every call counted"
                       + (f"; besides field fallbacks on {', '.join(sorted(fallbacks_apart))}, whose driver refuses "
                          "the fields they stand in for" if fallbacks_apart else ""))
    return Section("1. NVML calls", [table])


def _verdict(count: CallCount, report: Report, targeted: Set[str], fallbacks_apart: AbstractSet[str]) -> str:
    if count.label not in targeted:
        return "-"
    if count.label == HEADLINE_SCENARIO:
        report.headline["nvml_calls_per_gpu"] = count.total
    if count.label in fallbacks_apart:
        figure, name = count.besides_fallbacks, f"NVML calls per GPU per run besides field fallbacks, {count.label}"
    else:
        figure, name = count.total, f"NVML calls per GPU per run counting every call, {count.label}"
    return report.target(name, figure, f"<= {CALLS_LIMIT}", figure <= CALLS_LIMIT)
