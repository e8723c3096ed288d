"""One check instance on a simulated node, run the way benchmarks need it.

Scenario time stands still between runs and moves one check interval before each, so every
run sees fresh samples however fast runs follow each other. CPU is the check thread's own
(`time.thread_time`): the in-process kubelet and gRPC servers run on other threads and are not
counted; `sim.cpu_seconds` is what the simulated driver spent inside its NVML functions, and
each call's way into and out of them costs what `entry` measures beyond a call into C.
"""

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from datadog_checks.base.stubs import aggregator, tagger

from gpu_monitoring.check import GpuMonitoringCheck

from .entry import entry

INTERVAL = 15  # seconds of scenario time between runs, the Agent's default
NAMESPACE = "gpu_monitoring."
FIELD_VALUES = "nvmlDeviceGetFieldValues"

Series = Tuple[str, Any, List[str]]  # metric name, value, tags


class BenchError(RuntimeError):
    """The check failed a run: a figure measured on a failing check would mean nothing."""


@dataclass
class RunCost:
    cpu: float  # seconds of the check thread's CPU, the simulated driver's included
    inside: float  # seconds of that spent inside the simulated NVML functions
    calls: int  # NVML calls the run made

    @property
    def driver(self) -> float:
        """The simulated driver's part: inside its functions, and getting in and out of them."""
        return self.inside + self.calls * entry().excess_seconds

    @property
    def own(self) -> float:
        return self.cpu - self.driver

    @property
    def own_and_entry(self) -> float:
        """The check's own CPU with the calls' way into the simulator counted as the check's."""
        return self.cpu - self.inside


@dataclass
class Costs:
    """Median CPU per run over a number of runs, in milliseconds."""

    cpu_ms: float
    own_ms: float
    driver_ms: float
    series: int
    runs: int


class FieldEntries:
    """Counts the entries asked of nvmlDeviceGetFieldValues, and the thread CPU the simulated
    driver spent answering them.

    It wraps the simulated library's dispatch, beneath the ctypes call, so pynvml and the check
    run unchanged, and its own time counts as the simulated driver's, not the check's.
    """

    def __init__(self, sim: Any):
        self.count = 0
        self.seconds = 0.0
        dispatch = sim._dispatch

        def counting(name: str, symbol: Any, args: tuple) -> int:
            if name != FIELD_VALUES:
                return dispatch(name, symbol, args)
            self.count += int(args[1])  # (handle, count, values)
            started = time.thread_time()
            try:
                return dispatch(name, symbol, args)
            finally:
                self.seconds += time.thread_time() - started

        sim._dispatch = counting


class Bench:
    def __init__(self, scenario: str, **options: Any):
        self.check = GpuMonitoringCheck("gpu_monitoring", {}, [dict(options, simulate=scenario)])
        # Started before any run is measured: the proc root it serves is known, and no run pays for it.
        self.check.start()
        self.sim = self.check.simulated_node.nvml
        self.sim.clock.set_speed(0)
        self.node = self.check.simulated_node
        self.fields = FieldEntries(self.sim)

    def __enter__(self) -> "Bench":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.check.cancel()

    @property
    def gpus(self) -> int:
        return len(self.sim.devices)

    @property
    def proc_root(self) -> str:
        return self.check.derived.proc_root

    def warm_up(self, runs: int = 2) -> List[Series]:
        """The first run learns capabilities and takes first samples; the second is a steady one,
        whose submitted series are returned."""
        for _ in range(runs):
            self.run()
        return submitted()

    def run(self) -> RunCost:
        cost, error = self.measure(self.check.run)
        if error:
            raise BenchError(f"the check failed: {error}")
        return cost

    def measure(self, stage: Callable[[], Any]) -> Tuple[RunCost, Any]:
        """What stage() costs at the next instant, and what it returned."""
        self.sim.advance(INTERVAL)
        reset_stubs()
        inside, calls = self.sim.cpu_seconds, sum(self.sim.calls.values())
        started = time.thread_time()
        result = stage()
        cpu = time.thread_time() - started
        return RunCost(cpu, self.sim.cpu_seconds - inside, sum(self.sim.calls.values()) - calls), result

    def kubernetes_requests(self) -> Tuple[int, int]:
        """Requests the simulated kubelet (`/pods`) and pod-resources (both methods) received."""
        if self.node is None or self.node.kubelet is None:
            return 0, 0
        resources = self.node.pod_resources
        return self.node.kubelet.requests, resources.requests + resources.allocatable_requests


def costs_of(measured: Sequence[RunCost], series: int) -> Costs:
    return Costs(
        cpu_ms=median_ms(r.cpu for r in measured),
        own_ms=median_ms(r.own for r in measured),
        driver_ms=median_ms(r.driver for r in measured),
        series=series,
        runs=len(measured),
    )


def reset_stubs() -> None:
    """Empty the aggregator and tagger stubs before a run. Both record every submission and query
    for tests to assert on; the Agent's own hold none, and left alone they grow by a run's worth
    each run, which the memory figures would blame on the check."""
    aggregator.reset()
    tagger.reset()


def quiet_logs() -> None:
    """The simulated faults and refusals log by design; the bench's figures are what it prints.
    Child processes call it too: they do not inherit the parent's logging."""
    logging.basicConfig(level=logging.ERROR)


def submitted() -> List[Series]:
    """Every metric submission of the last run, as the aggregator holds it."""
    return [(stub.name, stub.value, list(stub.tags or [])) for name in aggregator.metric_names
            for stub in aggregator.metrics(name)]


def series_count() -> int:
    return sum(len(aggregator.metrics(name)) for name in aggregator.metric_names)


def median_ms(seconds: Any) -> float:
    return statistics.median(seconds) * 1000


def thread_times(stage: Callable[[], object], rounds: int) -> List[float]:
    """The calling thread's CPU seconds for each of `rounds` calls of `stage`."""
    spent = []
    for _ in range(rounds):
        started = time.thread_time()
        stage()
        spent.append(time.thread_time() - started)
    return spent


def per(value: float, count: Optional[float]) -> float:
    """value / count, NaN-free: a count of 0 gives 0 (nothing to share it among)."""
    return value / count if count else 0.0
