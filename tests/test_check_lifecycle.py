"""The check's constructor only reads its configuration: it opens, binds, creates and starts nothing.
What a run reads from (NVML, the kubelet, pod-resources, the sidecar, a simulated node) is opened by
the first run, and a simulated node is stopped by cancel()."""

import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.simulator.scenario import resolve

# The audit events that touch the world outside the process: files, directories, sockets, processes.
OUTSIDE = ("open", "os.", "socket.", "subprocess.", "tempfile.", "shutil.", "glob.", "ctypes.dlopen", "http.",
           "urllib.", "_thread.", "fcntl.", "mmap.")

# An audit hook cannot be removed: this one is installed once and records only while a list is set,
# and only the constructing thread's events (servers other tests left running answer in threads of
# their own meanwhile).
_events: Optional[List[Tuple[str, tuple]]] = None
_recording_thread: Optional[int] = None


def _record(event: str, args: tuple) -> None:
    if _events is not None and event.startswith(OUTSIDE) and threading.get_ident() == _recording_thread:
        _events.append((event, args))


sys.addaudithook(_record)


def construct(instance: dict) -> Tuple[GpuMonitoringCheck, List[Tuple[str, tuple]]]:
    """The check, and the outside-touching audit events its constructor raised."""
    global _events, _recording_thread
    _recording_thread = threading.get_ident()
    _events = []
    try:
        return GpuMonitoringCheck("gpu_monitoring", {}, [instance]), _events
    finally:
        _events = None


def open_fds() -> List[str]:
    return sorted(os.listdir("/proc/self/fd"))


def _settles(holds, seconds: float = 2.0) -> bool:
    """Whether `holds()` is true now or within `seconds`."""
    deadline = time.monotonic() + seconds
    while not holds():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def temp_dir(monkeypatch) -> Iterator[Path]:
    """Where tempfile makes directories for this test: what the check leaves there shows. A short
    path of its own, not pytest's tmp_path (deeper under parallel workers): the simulated node's
    pod-resources socket must fit a unix socket's 107 bytes."""
    directory = tempfile.mkdtemp(prefix="gm-")
    monkeypatch.setattr(tempfile, "tempdir", directory)
    yield Path(directory)
    shutil.rmtree(directory, ignore_errors=True)


def test_the_recorder_records():
    global _events, _recording_thread
    _recording_thread = threading.get_ident()
    _events = []
    try:
        with open(os.devnull):
            pass
    finally:
        recorded, _events = _events, None
    assert ("open", (os.devnull, "r", os.O_RDONLY | os.O_CLOEXEC)) in recorded


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors in /proc")
@pytest.mark.parametrize("instance", [
    {},
    {"kubernetes": True},
    {"source": "sidecar", "sidecar_socket": "/nonexistent/gpu-monitoring.sock"},
    {"simulate": "dgx-h100"},
], ids=["plain", "kubernetes", "sidecar", "simulated"])
def test_the_constructor_does_no_io_and_starts_nothing(instance, temp_dir):
    construct(instance)[0].cancel()  # modules imported and caches filled outside the count
    threads, fds = threading.enumerate(), open_fds()
    check, events = construct(instance)
    # A scenario is the `simulate` option's value: reading it (and only it) is reading the configuration,
    # so that one that cannot be loaded is a configuration error, as every other bad option is.
    scenario = str(resolve(instance["simulate"])) if "simulate" in instance else None
    assert [e for e in events if not (e[0] == "open" and e[1][0] == scenario and e[1][1] == "r")] == []
    # Descriptors and threads are the process's: other threads (servers earlier tests left, a library's
    # background scan of installed packages) open, close, start and end their own meanwhile. Nothing new
    # may stay: what the constructor opened or started would.
    assert _settles(lambda: set(threading.enumerate()) <= set(threads)), set(threading.enumerate()) - set(threads)
    assert _settles(lambda: set(open_fds()) <= set(fds)), set(open_fds()) - set(fds)
    assert list(temp_dir.iterdir()) == []
    assert (check.source, check.pods, check.dcgm) == (None, None, None)
    if check.simulated_node is not None:
        assert (check.simulated_node.kubelet, check.simulated_node.pod_resources) == (None, None)
    check.cancel()  # before any run: nothing to close


def test_a_simulated_node_starts_on_the_first_run_and_stops_on_cancel(aggregator, temp_dir):
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{"simulate": "dgx-h100", "hourly_price": {"*": 1.5}}])
    node = check.simulated_node
    assert check.run() == ""
    # The options point at what the node stands in for; the instance's own price still wins.
    assert check.pods.kubelet.url == f"{node.kubelet.url}/pods"
    assert check.derived.pod_resources_socket == node.pod_resources.socket_path
    assert Path(check.derived.proc_root).parent.parent == temp_dir
    assert check.derived.hourly_price == {"*": 1.5}
    assert {tag for stub in aggregator.metrics("gpu_monitoring.utilization.gpu") for tag in stub.tags
            if tag.startswith("pod_name:")}, "the simulated kubelet and pod-resources named the pods"
    check.cancel()
    assert (node.kubelet, node.pod_resources) == (None, None)
    assert list(temp_dir.iterdir()) == []
