"""Events are neither lost nor repeated: local runs that fail, journals damaged or wiped, a full disk,
a driver reload nobody polls through."""

import json
import os
import resource
import shutil
import time
from pathlib import Path

import pytest
from datadog_checks.base.stubs import aggregator as _aggregator

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.cli.main import main
from gpu_monitoring.sidecar.pump import BUFFER_EVENTS
from gpu_monitoring.sources import SIDECAR_CURSOR as CURSOR

from ..conftest import H100_PCIE_NODE, tag_dict
from ..sidecar_support import SidecarProcess, sidecar_check, wait_until

XIDS_THEN_QUIET = H100_PCIE_NODE + """
devices:
  - {model: h100, load: {utilization: 50}}
  - {model: h100, load: {utilization: 50}}
faults:
  - {at: 10, kind: xid, device: 0, xid: 13}
  - {at: 10, kind: xid, device: 1, xid: 79}
"""


def submitted_xids():
    counted = sorted(tag_dict(m.tags)["xid"] for m in _aggregator.metrics("gpu_monitoring.xid_errors")
                     for _ in range(int(m.value)))
    return counted, sorted(tag_dict(e["tags"])["xid"] for e in _aggregator.events)


def scenario_file(directory: Path, text: str) -> str:
    path = directory / f"scenario-{len(list(directory.glob('scenario-*.yaml')))}.yaml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def quiet_after_xids(node, tmp_path):
    return node(scenario_file(tmp_path, XIDS_THEN_QUIET))


# --- local mode: a run that fails after draining NVML --------------------------------------


def test_a_failed_local_run_redelivers_its_xids_once(quiet_after_xids, monkeypatch):
    quiet_after_xids.run()  # t=0, before the XIDs
    check = quiet_after_xids.check

    def agent_refuses(*_args):
        raise RuntimeError("the Agent could not take the event")

    quiet_after_xids.sim.advance(15)  # t=15: both XIDs are waiting in NVML
    _aggregator.reset()
    monkeypatch.setattr(_aggregator, "submit_event", agent_refuses)
    assert "could not take the event" in check.run()
    monkeypatch.undo()

    quiet_after_xids.sim.advance(15)
    _aggregator.reset()
    assert check.run() == ""
    assert submitted_xids() == (["13", "79"], ["13", "79"])

    quiet_after_xids.sim.advance(15)
    _aggregator.reset()
    assert check.run() == ""
    assert submitted_xids() == ([], [])


# --- the sidecar: NVML and the disk failing under the event thread ------------------------

RELOAD_THEN_XIDS = H100_PCIE_NODE + """
devices:
  - {model: h100, load: {utilization: 50}}
faults:
  - {at: 20, kind: driver_reload}
  - {at: 40, kind: xid, device: 0, xid: 13}
  - {at: 60, kind: xid, device: 0, xid: 31}
"""

NO_EVENT_SETS = H100_PCIE_NODE + """
missing_functions: [nvmlEventSetCreate]
devices:
  - {model: h100, load: {utilization: 50}}
"""

LATE_XIDS = H100_PCIE_NODE + """
devices:
  - {model: h100, load: {utilization: 50}}
faults:
  - {at: 50, kind: xid, device: 0, xid: 13}
  - {at: 60, kind: xid, device: 0, xid: 31}
  - {at: 70, kind: xid, device: 0, xid: 43}
"""


@pytest.fixture
def sidecar(tmp_path):
    started = []

    def start(scenario_text, *extra):
        # These count NVML's events by their seqs: the kernel's log, journaled the same way beside them
        # (tests/test_kernel_record_sidecar.py), is left out so that each seq is one of NVML's.
        process = SidecarProcess(tmp_path, scenario_file(tmp_path, scenario_text), "--kernel-log", "none", *extra)
        started.append(process.start())
        return started[-1]

    yield start
    for process in started:
        if process.process.poll() is None:
            resource.prlimit(process.process.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        process.stop()


def health(process: SidecarProcess) -> dict:
    return process.client().get("/healthz")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def journaled_codes(process: SidecarProcess) -> list:
    return [e.code for e in process.client().events(0, 100).events]


def test_xids_after_a_driver_reload_nobody_polls_through_are_journaled(sidecar):
    # 10 simulated seconds a second: the reload comes after 2 s, the XIDs after 4 and 6 s. Only the
    # event thread talks to NVML: no snapshot is asked for, so nothing else restarts it.
    process = sidecar(RELOAD_THEN_XIDS, "--speed", "10")
    wait_until(lambda: process.journal_last_seq() >= 2, 15,
               f"XIDs after the reload never reached the journal; log:\n{process.log_text()}")
    assert journaled_codes(process) == [13, 31]
    assert health(process)["events"] == "ok"


def test_events_nvml_cannot_give_are_told_by_health_without_spinning(sidecar):
    process = sidecar(NO_EVENT_SETS)
    wait_until(lambda: health(process)["events"] != "ok", 5, "health says events are fine without an event set")
    assert "nvmlEventSetCreate" in health(process)["events"]
    assert health(process)["status"] == "ok"  # snapshots are still served
    before = cpu_seconds(process.process.pid)
    time.sleep(3)
    assert cpu_seconds(process.process.pid) - before < 0.5, "the event thread spins while NVML refuses events"


def test_a_full_disk_holds_events_fails_the_probe_and_loses_nothing(sidecar, capsys):
    # The XIDs come 5, 6 and 7 s after the start; by then the journal cannot grow by a byte.
    process = sidecar(LATE_XIDS, "--speed", "10")
    pid = process.process.pid
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
    wait_until(lambda: health(process)["events_buffered"] == 3, 20, "the three XIDs were not held")
    failing = health(process)
    assert failing["status"] == "failing"
    assert "File too large" in failing["journal"]
    assert (failing["events_dropped"], failing["events_buffer_size"], failing["last_seq"]) == (0, BUFFER_EVENTS, 0)
    assert main(["healthz", "--socket", process.socket]) == 1
    # The liveness probe still passes: a restart would lose the events held in memory.
    assert main(["healthz", "--live", "--socket", process.socket]) == 0
    capsys.readouterr()

    resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    wait_until(lambda: health(process)["status"] == "ok", 40, "the journal never took the held events")
    assert journaled_codes(process) == [13, 31, 43]
    recovered = health(process)
    assert (recovered["journal"], recovered["events_buffered"], recovered["events_dropped"]) == ("ok", 0, 0)
    assert main(["healthz", "--socket", process.socket]) == 0


# --- the sidecar's journal: a check's cursor across kill -9, damage and a wiped journal ----

def xids_at(*codes: int) -> str:
    faults = "".join(f"  - {{at: {10 * (n + 1)}, kind: xid, device: 0, xid: {code}}}\n" for n, code in enumerate(codes))
    return H100_PCIE_NODE + "devices:\n  - {model: h100, load: {utilization: 50}}\nfaults:\n" + faults


def run_once(check: GpuMonitoringCheck) -> tuple:
    _aggregator.reset()
    assert check.run() == ""
    return submitted_xids()


def test_a_wiped_journal_is_read_from_its_start(sidecar, tmp_path, datadog_agent):
    first = sidecar(xids_at(13, 31), "--speed", "20")
    wait_until(lambda: first.journal_last_seq() >= 2, 15, "the first XIDs never reached the journal")
    check = sidecar_check(first.socket)
    assert run_once(check)[0] == ["13", "31"]
    assert first.stop() == 0
    shutil.rmtree(first.journal)
    # The new journal numbers from 1 again and soon holds more than the check's cursor (2).
    second = sidecar(xids_at(43, 48, 79), "--speed", "20")
    wait_until(lambda: second.journal_last_seq() >= 3, 15, "the later XIDs never reached the journal")
    assert run_once(check)[0] == ["43", "48", "79"]
    assert run_once(check) == ([], [])


def test_after_kill_9_and_a_damaged_last_record_no_seq_is_reused(sidecar, tmp_path, datadog_agent):
    first = sidecar(xids_at(13, 31), "--speed", "20")
    wait_until(lambda: first.journal_last_seq() >= 2, 15, "the first XIDs never reached the journal")
    check = sidecar_check(first.socket)
    assert run_once(check)[0] == ["13", "31"]
    first.process.kill()  # SIGKILL: the journal is not closed
    first.process.wait()
    (segment,) = Path(first.journal).glob("events-*.log")
    data = bytearray(segment.read_bytes())
    data[-5] ^= 0x01  # a flipped bit in the record the check has read
    segment.write_bytes(bytes(data))
    second = sidecar(xids_at(43), "--speed", "20")
    wait_until(lambda: second.journal_last_seq() >= 3, 15, "the XID after the restart got a seq already passed")
    assert run_once(check)[0] == ["43"]


def test_a_cursor_stored_before_epochs_goes_on_in_the_same_journal(sidecar, datadog_agent):
    process = sidecar(xids_at(13, 31), "--speed", "20")
    wait_until(lambda: process.journal_last_seq() >= 2, 15, "the XIDs never reached the journal")
    check = sidecar_check(process.socket)
    assert run_once(check)[0] == ["13", "31"]
    check.write_persistent_cache(CURSOR, "1")  # as an older check left it, after one event
    assert run_once(check)[0] == ["31"]
    stored = json.loads(check.read_persistent_cache(CURSOR))
    assert stored == {"epoch": health(process)["epoch"], "seq": 2}
