"""The check in local mode and in sidecar mode on dgx-h100, each measured in a child process of its own.

A child starts with a clean heap and RSS, and tracemalloc in one process does not slow the
other: the two modes run side by side, the sidecar as a third process serving the second.
"""

import tempfile
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, List, Optional

from gpu_monitoring.check import GpuMonitoringCheck
from tests.sidecar_support import SidecarProcess

from . import children
from .harness import Bench, quiet_logs, reset_stubs
from .memory import MemoryFigures, measure

SCENARIO = "dgx-h100"
MODES = ("local", "sidecar")


class LocalRunner:
    sidecar_pid: Optional[int] = None

    def __init__(self) -> None:
        self.bench = Bench(SCENARIO)
        self.failures = 0

    def run(self) -> None:
        self.bench.run()

    def close(self) -> None:
        self.bench.check.cancel()


class SidecarRunner:
    """A real sidecar serving the simulated node over its unix socket, and a check reading it."""

    def __init__(self, directory: Path):
        self.sidecar = SidecarProcess(directory, SCENARIO, "--log-level", "ERROR").start()
        self.sidecar_pid = self.sidecar.process.pid
        self.check = GpuMonitoringCheck("gpu_monitoring", {}, [
            {"source": "sidecar", "sidecar_socket": self.sidecar.socket, "kubernetes": False}])
        self.failures = 0

    def run(self) -> None:
        reset_stubs()
        if self.check.run():
            self.failures += 1

    def close(self) -> None:
        self.check.cancel()
        self.sidecar.stop()


def measure_modes(runs: int, traced: int, warm_up: int) -> List[MemoryFigures]:
    context = children.context()
    with ProcessPoolExecutor(max_workers=len(MODES), mp_context=context) as pool:
        futures = [pool.submit(_measure_here, mode, runs, traced, warm_up) for mode in MODES]
        return [future.result() for future in futures]


def _measure_here(mode: str, runs: int, traced: int, warm_up: int) -> MemoryFigures:
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="gpu-monitoring-bench-") as tmp:
        tracemalloc.start()
        runner: Any = LocalRunner() if mode == "local" else SidecarRunner(Path(tmp))
        try:
            return measure(mode, runner, runs, traced, warm_up)
        finally:
            runner.close()
