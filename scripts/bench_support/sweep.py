"""Several scenarios measured side by side, their runs interleaved round by round.

This machine's speed drifts over seconds, so points of a sweep measured one after the other
bend with it. Interleaving needs every point's check alive at once, and pynvml keeps its loaded
library in module state, one per process: so each point lives in a child process of its own,
and the parent has them run one at a time, round after round, each round from another start.
"""

import traceback
from multiprocessing.connection import Connection
from typing import Any, Dict, List, Sequence

from . import children
from .harness import Bench, BenchError, Costs, RunCost, costs_of, quiet_logs, series_count

_RUN, _STOP = "run", "stop"


class BenchProcess:
    """A Bench in a child process that runs the check once for each request."""

    def __init__(self, context: Any, scenario: str, warm_up: int, options: Dict[str, Any]):
        self.scenario = scenario
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, scenario, warm_up, options), daemon=True)
        self.process.start()
        self.series = 0

    def ready(self) -> None:
        self._answer()

    def run(self) -> RunCost:
        self.connection.send(_RUN)
        cost, self.series = self._answer()
        return cost

    def stop(self) -> None:
        if self.process.is_alive():
            self.connection.send(_STOP)
        self.process.join(timeout=30)

    def _answer(self) -> Any:
        kind, value = self.connection.recv()
        if kind == "error":
            raise BenchError(f"{self.scenario}: {value}")
        return value


def measure_all(scenarios: Sequence[str], runs: int, warm_up: int = 2, **options: Any) -> List[Costs]:
    """Median costs per run of each scenario, measured interleaved."""
    context = children.context()
    points = [BenchProcess(context, scenario, warm_up, options) for scenario in scenarios]
    try:
        for point in points:  # built and warmed up side by side: nothing is measured yet
            point.ready()
        measured: List[List[RunCost]] = [[] for _ in points]
        for round_ in range(runs):
            for i in _rotated(len(points), round_):
                measured[i].append(points[i].run())
        return [costs_of(costs, point.series) for costs, point in zip(measured, points)]
    finally:
        for point in points:
            point.stop()


def _serve(connection: Connection, scenario: str, warm_up: int, options: Dict[str, Any]) -> None:
    quiet_logs()
    try:
        with Bench(scenario, **options) as bench:
            bench.warm_up(warm_up)
            connection.send(("ready", None))
            while connection.recv() == _RUN:
                connection.send(("cost", (bench.run(), series_count())))
    except Exception:  # the parent says which point failed, with the child's traceback
        connection.send(("error", traceback.format_exc()))


def _rotated(count: int, by: int) -> List[int]:
    by %= max(count, 1)
    return list(range(by, count)) + list(range(by))
