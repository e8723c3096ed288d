"""One log line per fault per state change: a fault that lasts is not logged again every run or
for every process it touches."""

import logging
import os
from pathlib import Path

import pynvml
import pytest
import yaml
from datadog_checks.base import AgentCheck
from datadog_checks.base.stubs import aggregator as _aggregator

from gpu_monitoring.simulator.scenario import SCENARIO_DIR
from gpu_monitoring.status import Status

from ..conftest import INTERVAL
from ..sidecar_support import SidecarProcess
from ..test_sidecar import SIDECAR_CHECK, sidecar_check
from .test_fault_matrix import Script

OK, WARNING, CRITICAL = AgentCheck.OK, AgentCheck.WARNING, AgentCheck.CRITICAL
PROCESSES_LOGGER = "gpu_monitoring.collectors.processes"
RUNS = 4


def _records(caplog, level):
    return [r for r in caplog.records if r.name == PROCESSES_LOGGER and r.levelno == level]


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.INFO, logger=PROCESSES_LOGGER)
    return caplog


def test_missing_proc_root_is_one_line_for_every_process_and_run(node, logs, tmp_path):
    # dgx-h100 lists a dozen processes on eight GPUs: once per process per run was 48 lines.
    dgx = node("dgx-h100", kubernetes="false", proc_root=str(tmp_path / "not-mounted"))
    dgx.run(RUNS)
    assert dgx.values("processes.count")
    warnings = _records(logs, logging.WARNING)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "not-mounted" in warnings[0].getMessage()


def test_proc_root_that_comes_and_goes_logs_each_change_once(node, logs):
    legacy = node("legacy-driver")
    root = Path(legacy.check.derived.proc_root)
    legacy.run()
    root.rename(root.with_name("unmounted"))
    legacy.run(RUNS)
    root.with_name("unmounted").rename(root)
    legacy.run(RUNS)
    assert len(_records(logs, logging.WARNING)) == 1
    assert len(_records(logs, logging.INFO)) == 1
    names = {t for s in legacy.series("process.memory.used") for t in s.tags if t.startswith("process_name:")}
    assert names == {"process_name:python", "process_name:blender"}


def _break_cgroups(root: Path) -> None:
    directory, loop = root / "9101" / "cgroup", root / "9202" / "cgroup"
    directory.unlink()
    directory.mkdir()
    loop.unlink()
    os.symlink(loop, loop)


def _mend_cgroups(root: Path) -> None:
    directory, loop = root / "9101" / "cgroup", root / "9202" / "cgroup"
    directory.rmdir()
    loop.unlink()
    for file in (directory, loop):
        file.write_text("0::/init.scope\n")


def test_cgroup_directory_and_symlink_loop_log_once_each(node, logs):
    legacy = node("legacy-driver")
    root = Path(legacy.check.derived.proc_root)
    _break_cgroups(root)
    legacy.run(RUNS)
    warnings = sorted(r.getMessage() for r in _records(logs, logging.WARNING))
    assert len(warnings) == 2, warnings
    assert "Is a directory" in warnings[0] and "symbolic links" in warnings[1]
    # Names are still read: only the owners are unknown.
    names = {t for s in legacy.series("process.memory.used") for t in s.tags if t.startswith("process_name:")}
    assert names == {"process_name:python", "process_name:blender"}
    _mend_cgroups(root)
    legacy.run(RUNS)
    assert len(_records(logs, logging.WARNING)) == 2
    assert len(_records(logs, logging.INFO)) == 2


# --- the service checks that say why: one line per change of reason, one when it clears ---------

CHECK_LOGGER = "datadog_checks.base.checks.base.gpu_monitoring"


def _phases(run, check_name: str, phases) -> list:
    """Runs each phase (a change to make, then RUNS check runs); every run of a phase must send the
    service check with the same status and message: returns them, one (status, message) a phase."""
    sent = []
    for change in phases:
        change()
        for _ in range(RUNS):
            run()
            (stub,) = _aggregator.service_checks(check_name)
            sent.append((stub.status, stub.message))
    by_phase = [set(sent[i:i + RUNS]) for i in range(0, len(sent), RUNS)]
    assert all(len(phase) == 1 for phase in by_phase), sent
    return [phase.pop() for phase in by_phase]


def _told(caplog) -> list:
    """The check's own WARNING and INFO lines, in order."""
    return [(r.levelno, r.getMessage()) for r in caplog.records
            if r.name == CHECK_LOGGER and r.levelno in (logging.INFO, logging.WARNING)]


def test_nvml_check_tells_each_change_of_reason_once(node, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger=CHECK_LOGGER)
    # The driver reloads after the second phase's last run: NVML starts afresh in the third.
    reload_at = (2 * RUNS - 1) * INTERVAL + 5
    scenario = yaml.safe_load((SCENARIO_DIR / "dgx-h100.yaml").read_text())
    scenario["faults"] = [{"at": reload_at, "kind": "driver_reload"}]
    (tmp_path / "reload.yaml").write_text(yaml.safe_dump(scenario))
    dgx = node(str(tmp_path / "reload.yaml"), kubernetes="false")
    not_loaded = Script(dgx).answer("nvmlInitWithFlags", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    denied = Script(dgx).answer("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.NVML_ERROR_NO_PERMISSION)
    denied.failing = False

    def loaded_but_denied():
        not_loaded.failing = False
        denied.failing = True

    def permitted():
        denied.failing = False

    sent = _phases(dgx.run, "gpu_monitoring.nvml.can_connect", [lambda: None, loaded_but_denied, permitted])
    (_, missing), (_, refused), _ = sent
    assert sent == [(CRITICAL, missing), (WARNING, refused), (OK, "")]
    assert "Driver Not Loaded" in missing and "GPU 0: NVML denies" in refused
    assert _told(caplog) == [(logging.WARNING, f"Cannot read GPUs: {missing}"),
                             (logging.WARNING, f"NVML answers, but: {refused}"),
                             (logging.INFO, "NVML is available again")]


def test_kubelet_check_tells_each_change_of_reason_once(node, caplog):
    caplog.set_level(logging.INFO, logger=CHECK_LOGGER)
    dgx = node("dgx-h100", pod_cache_ttl=0)
    kubelet = dgx.check.simulated_node.kubelet

    def behave(how):
        return lambda: setattr(kubelet, "behaviour", how)

    sent = _phases(dgx.run, "gpu_monitoring.kubelet.can_connect",
                   [behave("ok"), behave("error"), behave("unauthorized"), behave("ok")])
    _, (_, failing), (_, refusing), _ = sent
    assert sent == [(OK, ""), (WARNING, failing), (CRITICAL, refusing), (OK, "")]
    assert "HTTP 500" in failing and "HTTP 401" in refusing
    degraded = "Kubernetes attribution degraded: "
    assert _told(caplog) == [(logging.WARNING, degraded + failing), (logging.WARNING, degraded + refusing),
                             (logging.INFO, "kubelet and pod-resources answer again")]


# The event cursor the check saves goes to the stub Agent's cache, which every check in the tests shares.
@pytest.mark.usefixtures("datadog_agent")
def test_sidecar_check_tells_each_change_of_reason_once(caplog, tmp_path):
    caplog.set_level(logging.INFO, logger=CHECK_LOGGER)
    sidecar = SidecarProcess(tmp_path, "legacy-driver")
    check = sidecar_check(sidecar.socket)

    def run():
        _aggregator.reset()
        assert check.run() == ""

    try:
        sent = _phases(run, SIDECAR_CHECK, [lambda: None, sidecar.start, sidecar.stop])
    finally:
        sidecar.stop()
        check.cancel()
    (_, absent), _, _ = sent
    assert sent == [(CRITICAL, absent), (OK, ""), (CRITICAL, absent)]
    assert "no sidecar socket" in absent
    # The same reason again is a change once the sidecar has answered in between.
    cannot_read = (logging.WARNING, f"Cannot read the sidecar: {absent}")
    assert _told(caplog) == [cannot_read, (logging.INFO, "The sidecar answers again"), cannot_read]


def test_status_ranks_as_the_agent_numbers_it():
    assert [int(s) for s in Status] == [AgentCheck.OK, AgentCheck.WARNING, AgentCheck.CRITICAL]
    assert max(Status.WARNING, Status.CRITICAL, Status.OK) is Status.CRITICAL
    assert [s.name for s in Status] == ["OK", "WARNING", "CRITICAL"]
