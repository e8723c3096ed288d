"""The sidecar's probes, its start-up line and its help.

Readiness (`gpu-monitoring healthz`, GET /healthz) fails while NVML cannot be read at all (the
library missing, initialisation failing, not one GPU answering) or the journal cannot be written,
and its line says why; liveness (`healthz --live`) fails only when nothing answers. The probe costs
one cheap NVML call per GPU, and none while a recent snapshot already said.
"""

import argparse
import re
import resource
import threading

import pytest

from gpu_monitoring.cli.main import main
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.sidecar import command
from gpu_monitoring.sidecar.readiness import FRESH_SECONDS, LOCK_SECONDS, NvmlReadiness
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import load as load_scenario
from gpu_monitoring.snapshot import Device

from .conftest import H100_PCIE_NODE
from .sidecar_support import sidecars_fixture, wait_until  # noqa: F401

EVERY_GPU_LOST = H100_PCIE_NODE + """
devices:
  - {model: h100, load: {utilization: 10}}
  - {model: h100, load: {utilization: 10}}
faults:
  - {at: 0, kind: gpu_lost, device: 0}
  - {at: 0, kind: gpu_lost, device: 1}
"""
# At --speed 10, the XID comes 2 s after the start.
XID_AFTER_START = H100_PCIE_NODE + """
devices:
  - {model: h100, load: {utilization: 10}}
faults:
  - {at: 20, kind: xid, device: 0, xid: 13}
"""


def healthz(capsys, socket, *flags):
    """(exit status, printed line) of `gpu-monitoring healthz`."""
    status = main(["healthz", *flags, "--socket", socket])
    out = capsys.readouterr()
    return status, (out.out + out.err).strip()


def scenario_file(tmp_path, text):
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return str(path)


def start_up_line(sidecar):
    (line,) = [line for line in sidecar.log_text().splitlines() if "serving on" in line]
    return line


def test_ready_on_a_healthy_node(sidecars, capsys):
    sidecar = sidecars("dgx-h100")
    code, line = healthz(capsys, sidecar.socket)
    # The journal holds what the kernel's log told of this boot already.
    assert code == 0 and re.fullmatch(r"ok: nvml ok; journal ok; events ok; last_seq \d+", line)
    assert healthz(capsys, sidecar.socket, "--live")[0] == 0


@pytest.mark.parametrize("case", ["library missing", "every GPU lost"])
def test_not_ready_while_nvml_cannot_be_read_but_alive(sidecars, capsys, tmp_path, case):
    if case == "library missing":
        sidecar = sidecars(None, "--nvml-library-path", str(tmp_path / "libnvidia-ml.so.1"), ready=False)
        why = f"could not load --nvml-library-path {tmp_path / 'libnvidia-ml.so.1'}"
    else:
        sidecar = sidecars(scenario_file(tmp_path, EVERY_GPU_LOST), ready=False)
        why = "no GPU can be read: GPU 0: "
    status, line = healthz(capsys, sidecar.socket)
    assert status == 1
    assert line.startswith(f"failing: nvml: {why}")
    assert healthz(capsys, sidecar.socket, "--live")[0] == 0
    assert " WARNING " in start_up_line(sidecar) and f"NVML cannot be read: {why}" in start_up_line(sidecar)


def test_not_ready_while_the_journal_cannot_be_written_but_alive(sidecars, capsys, tmp_path):
    sidecar = sidecars(scenario_file(tmp_path, XID_AFTER_START), "--speed", "10")
    # The journal cannot grow by a byte: the XID waits in memory.
    resource.prlimit(sidecar.process.pid, resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
    try:
        wait_until(lambda: sidecar.client().get("/healthz")["events_buffered"] == 1, 20, "the XID was not held")
        status, line = healthz(capsys, sidecar.socket)
        assert status == 1
        assert line.startswith("failing: nvml ok; journal: cannot write: ") and "File too large" in line
        assert healthz(capsys, sidecar.socket, "--live")[0] == 0
    finally:
        resource.prlimit(sidecar.process.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)


def test_not_alive_when_nothing_answers(capsys, tmp_path):
    for flags in ((), ("--live",)):
        status, line = healthz(capsys, str(tmp_path / "none.sock"), *flags)
        assert status == 1 and str(tmp_path / "none.sock") in line


def test_the_probe_asks_each_gpu_once_and_reuses_what_a_snapshot_learnt():
    nvml = SimulatedNvml(load_scenario("dgx-h100"), SimClock(speed=0))
    session = NvmlSession(nvml.library)
    now = [0.0]
    readiness = NvmlReadiness(session, threading.Lock(), clock=lambda: now[0])
    try:
        assert readiness.problem() is None  # starts NVML
        nvml.calls.clear()
        now[0] += FRESH_SECONDS - 1
        assert readiness.problem() is None
        assert sum(nvml.calls.values()) == 0
        now[0] += 1
        assert readiness.problem() is None
        assert dict(nvml.calls) == {"nvmlDeviceGetTemperature": len(nvml.devices)}
    finally:
        session.stop()


def test_a_snapshot_that_read_no_gpu_fails_readiness_without_a_probe():
    readiness = NvmlReadiness(NvmlSession("/nonexistent/libnvidia-ml.so.1"), threading.Lock())
    readiness.learn([Device(index=0, uuid="GPU-0", lost=True, error="nvmlDeviceGetUUID: GPU is lost"),
                     Device(index=1, uuid="GPU-1", lost=True, error=None)])
    assert readiness.problem() == "no GPU can be read: GPU 0: nvmlDeviceGetUUID: GPU is lost; GPU 1: lost"
    readiness.learn([Device(index=0, uuid="GPU-0", lost=True, error="lost"), Device(index=1, uuid="GPU-1")])
    assert readiness.problem() is None


def test_a_hung_nvml_call_fails_readiness_without_hanging_the_probe():
    lock = threading.Lock()
    readiness = NvmlReadiness(NvmlSession("/nonexistent/libnvidia-ml.so.1"), lock)
    with lock:  # as a snapshot stuck in the driver holds it
        assert readiness.problem() == f"an NVML call has not returned for over {LOCK_SECONDS:g} s"


def test_the_start_up_line_names_gpus_driver_journal_and_pod_resources(sidecars):
    sidecar = sidecars("dgx-h100")
    scenario = load_scenario("dgx-h100")
    (model,) = {device["name"] for device in scenario.devices}
    count = len(scenario.devices)
    line = start_up_line(sidecar)
    assert " INFO " in line
    assert f"{count} GPUs ({count}x {model}), driver {scenario.driver['version']}" in line
    assert f"journal {sidecar.journal}, last seq 0" in line
    assert "pod-resources " in line and " reads: 7 devices allocated" in line


def test_without_pod_resources_the_start_up_line_says_it_is_not_read(sidecars):
    assert "pod-resources not read" in start_up_line(sidecars("legacy-driver"))


def parsers():
    commands = argparse.ArgumentParser(prog="gpu-monitoring").add_subparsers()
    command.add_parsers(commands)
    return commands.choices


@pytest.mark.parametrize("name", ["sidecar", "healthz"])
def test_help_shows_every_default(name, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: paths unbroken
    with pytest.raises(SystemExit) as exited:
        main([name, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    # Each option's entry: its line, and the next when its name is too long to share one with its help.
    entries = {entry.split()[0]: " ".join(entry.split()) for entry in re.split(r"\n(?=  -)", text)}
    for action in parsers()[name]._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        line = entries[action.option_strings[0]]
        assert "(default" in line, line
        if action.default not in (None, False):
            shown = format(action.default, "g") if isinstance(action.default, float) else str(action.default)
            assert f"default {shown}" in line, line
    if name == "healthz":
        assert "--socket PATH" in text and "the unix socket the sidecar serves" in text
