"""The submission floor: the least any check submitting the same series could cost.

`FloorCheck` submits, as gauges, exactly the series the real check submitted in a steady run
(same names, same tag lists, same count) through the same `AgentCheck` path into the same
aggregator. The rest of the real check's CPU is what it spends finding those values.
"""

import time
from dataclasses import dataclass
from typing import Any, List, Tuple

from datadog_checks.base import AgentCheck

from .harness import NAMESPACE, Bench, RunCost, Series, median_ms, per, reset_stubs, series_count
from .interleave import interleave


class FloorCheck(AgentCheck):
    # The same namespace as the real check, so both pay for prefixing names.
    __NAMESPACE__ = NAMESPACE.rstrip(".")

    def __init__(self, series: List[Series]):
        super().__init__("gpu_monitoring_floor", {}, [{}])
        self.series = [(name[len(NAMESPACE):] if name.startswith(NAMESPACE) else name, value, tags)
                       for name, value, tags in series]

    def check(self, _instance: Any) -> None:
        for name, value, tags in self.series:
            self.gauge(name, value, tags=tags)


@dataclass
class FloorComparison:
    cpu_ms: float  # the check, per run, the simulated driver included
    own_ms: float  # the check, per run, the simulated driver excluded
    own_and_entry_ms: float  # the same, the calls' way into the simulated driver counted as the check's
    floor_ms: float
    series: int  # what the check submitted per run
    floor_series: int
    rounds: int

    @property
    def ratio_own(self) -> float:
        """The headline: the check's own CPU per series over the floor's."""
        return per(per(self.own_ms, self.series), per(self.floor_ms, self.floor_series))

    @property
    def ratio_own_and_entry(self) -> float:
        return per(per(self.own_and_entry_ms, self.series), per(self.floor_ms, self.floor_series))

    @property
    def ratio_with_driver(self) -> float:
        return per(per(self.cpu_ms, self.series), per(self.floor_ms, self.floor_series))


def compare(scenario: str, rounds: int, **options: Any) -> FloorComparison:
    """The check's steady runs (with instance `options`) and the floor, interleaved."""
    with Bench(scenario, **options) as bench:
        floor = FloorCheck(bench.warm_up(2))
        floor.run()  # its own first run (initializations) is no steady one either
        checks, floors = interleave(rounds, lambda: counted_run(bench), lambda: _floor_run(floor))
    return FloorComparison(
        cpu_ms=median_ms(r.cpu for r, _ in checks),
        own_ms=median_ms(r.own for r, _ in checks),
        own_and_entry_ms=median_ms(r.own_and_entry for r, _ in checks),
        floor_ms=median_ms(floors),
        series=checks[-1][1],
        floor_series=len(floor.series),
        rounds=rounds,
    )


def counted_run(bench: Bench) -> Tuple[RunCost, int]:
    """A check run and the series it submitted, counted before the floor's run resets the aggregator."""
    return bench.run(), series_count()


def _floor_run(floor: FloorCheck) -> float:
    reset_stubs()
    started = time.thread_time()
    floor.run()
    return time.thread_time() - started
