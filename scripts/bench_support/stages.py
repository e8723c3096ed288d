"""The stages of a steady run, each timed on its own with the inputs a steady run gave it.

Reading the node (NVML; pod-resources is asked once per pod_cache_ttl, not in a steady run),
attribution, health and submission are called one after another, interleaved with whole runs and
the floor, each round at a new instant.
Own CPU leaves the simulated driver out as section 2 does. A whole run costs more than the sum of
its stages: they share the processor's caches with each other, and the run's garbage sets the
collector off.
"""

from typing import Any, Callable, Dict, List

from gpu_monitoring.attribution.pipeline import attribute

from .floor import FloorCheck
from .harness import Bench, median_ms
from .report import Table


def table(scenario: str, rounds: int, **options: Any) -> Table:
    with Bench(scenario, **options) as bench:
        floor = FloorCheck(bench.warm_up(2))
        floor.run()
        check = bench.check
        snapshot = check.source.read()
        judge = check.judge
        judge.take_in(snapshot)
        pods = check._read_pods(snapshot)
        attribution = attribute(snapshot, pods, check.config.effective_threshold, check.price_of,
                                check.derived.expected_gpus)
        healths = judge.gpus(snapshot, attribution)
        node = judge.node(snapshot)
        stages: Dict[str, Callable[[], object]] = {
            "whole run": bench.run,
            "floor: the same series submitted as gauges": floor.run,
            "reading the node": check.source.read,
            "attribution": lambda: attribute(snapshot, pods, check.config.effective_threshold, check.price_of,
                                             check.derived.expected_gpus),
            "the kernel's record (what it told, XIDs joined) and PCIe AER counted": lambda: judge.take_in(snapshot),
            "health": lambda: judge.gpus(snapshot, attribution),
            "node health": lambda: judge.node(snapshot),
            "submission": lambda: check.submitter.submit(snapshot, healths, attribution, node),
        }
        measured: Dict[str, List[float]] = {name: [] for name in stages}
        for _ in range(rounds):
            for name, stage in stages.items():
                measured[name].append(bench.measure(stage)[0].own)
    ms = {name: median_ms(seconds) for name, seconds in measured.items()}
    floor_ms = ms["floor: the same series submitted as gauges"]
    ms["submission beyond the floor"] = ms["submission"] - floor_ms
    parts = ("reading the node", "the kernel's record (what it told, XIDs joined) and PCIe AER counted",
             "attribution", "health", "node health", "submission")
    ms["whole run less its stages"] = ms["whole run"] - sum(ms[name] for name in parts)
    beyond = ms["whole run"] - floor_ms
    return Table(
        f"Stages of a steady run, {scenario}: own CPU, median of {rounds} interleaved rounds",
        ["stage", "own ms/run", "share of the run beyond the floor"],
        [[name, value, f"{value / beyond:.0%}" if beyond > 0 and name not in _WHOLE else ""]
         for name, value in ms.items()],
        ["each stage is called with the inputs a steady run gave it; `whole run less its stages`",
         "is what running them together adds (shared caches, garbage collection, service checks of the run)"],
    )


_WHOLE = ("whole run", "floor: the same series submitted as gauges", "submission")
