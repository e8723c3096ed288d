"""One log line per fault per state change: a fault that lasts is not logged again every run or
for every process it touches."""

import logging
import os
from pathlib import Path

import pytest

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
    root = Path(legacy.check.options.proc_root)
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
    root = Path(legacy.check.options.proc_root)
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
