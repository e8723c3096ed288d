"""Running the sidecar as a real subprocess for tests, and talking to it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List, Optional

import pytest

from gpu_monitoring.sidecar.client import SidecarClient, SidecarUnavailable
from gpu_monitoring.snapshot import Event

STARTUP_SECONDS = 30


class SidecarProcess:
    """`gpu-monitoring sidecar --simulate ...` in a child process, on a socket and journal in tmp_path,
    run by `python` (this one unless told)."""

    def __init__(self, directory: Path, scenario: Optional[str], *extra: str, python: str = sys.executable):
        self.socket = str(directory / "run" / "sidecar.sock")
        self.journal = str(directory / "journal")
        self.log = directory / "sidecar.log"
        simulate = ["--simulate", scenario] if scenario else []
        self.args = [python, "-m", "gpu_monitoring.cli", "sidecar", *simulate,
                     "--socket", self.socket, "--journal", self.journal, *extra]
        self.process = None

    def start(self, ready: bool = True, **popen: Any) -> "SidecarProcess":
        """Start it and wait until it answers and, when `ready`, passes its readiness rule."""
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, **popen)
        wait_until(lambda: self._up(ready), STARTUP_SECONDS, f"sidecar did not come up; log:\n{self.log_text()}")
        return self

    def _up(self, ready: bool) -> bool:
        assert self.process.poll() is None, f"sidecar exited {self.process.returncode}; log:\n{self.log_text()}"
        try:
            status = self.client().get("/healthz")["status"]
        except SidecarUnavailable:
            return False
        return status == "ok" or not ready

    def client(self) -> SidecarClient:
        return SidecarClient(self.socket, timeout=10)

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"sidecar ignored SIGTERM; log:\n{self.log_text()}") from None

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def journal_last_seq(self) -> int:
        return self.client().events(0, 1).journal_last_seq

    def journaled(self, source: str = "nvml") -> List[Event]:
        """The journal's events that came from `source`: NVML's event set, or the kernel's log."""
        return [event for event in self.client().events(0, 1000).events if event.source == source]


@pytest.fixture(name="sidecars")
def sidecars_fixture(tmp_path):
    """`sidecars` in a module that imports this: start(scenario, *extra, ready=True, directory=tmp_path) gives
    a started SidecarProcess, stopped after the test."""
    started = []

    def start(scenario: Optional[str], *extra: str, ready: bool = True, directory: Path = tmp_path) -> SidecarProcess:
        started.append(SidecarProcess(directory, scenario, *extra).start(ready=ready))
        return started[-1]

    yield start
    for process in started:
        process.stop()


def sidecar_check(socket_path: str, **options: Any):
    """A check reading the sidecar on `socket_path`, off Kubernetes unless `options` say otherwise."""
    from gpu_monitoring.check import GpuMonitoringCheck

    instance = dict({"kubernetes": False}, **options, source="sidecar", sidecar_socket=socket_path)
    return GpuMonitoringCheck("gpu_monitoring", {}, [instance])


def wait_until(condition, seconds: float, message: str) -> None:
    """Poll `condition` until it holds, for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(message)


def socket_mode(path: str) -> int:
    return os.stat(path).st_mode & 0o777
