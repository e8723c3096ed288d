"""A sidecar that cannot start says why in one line on stderr and exits non-zero: no traceback."""

import os
import subprocess
import sys

import pytest

from gpu_monitoring.sidecar.journal import Journal

PREFIX = "gpu-monitoring sidecar: cannot start: "
STARTUP_SECONDS = 20
# How long the sidecar waits for a journal another sidecar holds (a restart's overlap; 30 s unless
# --journal-wait says otherwise), then gives up.
JOURNAL_WAIT_SECONDS = 1


def sidecar(socket, journal, scenario="dgx-h100"):
    args = [sys.executable, "-m", "gpu_monitoring.cli", "sidecar", "--simulate", str(scenario), "--log-level", "ERROR",
            "--socket", str(socket), "--journal", str(journal), "--journal-wait", str(JOURNAL_WAIT_SECONDS)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def refusal(process, seconds=STARTUP_SECONDS, status=1, prefix=PREFIX):
    """The one line a sidecar that did not start wrote on stderr."""
    try:
        out, err = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"the sidecar started or hung instead of refusing: {process.communicate()}") from None
    assert process.returncode == status, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    return lines[0]


@pytest.fixture(scope="module", autouse=True)
def locked_journal(tmp_path_factory):
    """A sidecar started on a journal this test process holds."""
    directory = tmp_path_factory.mktemp("locked")
    holder = Journal(str(directory / "journal"))
    contender = sidecar(directory / "sidecar.sock", directory / "journal")
    yield holder, contender
    if contender.poll() is None:
        contender.kill()
        contender.wait()
    holder.close()


def test_socket_path_too_long_for_af_unix(tmp_path):
    # A value the flag's rule refuses is a usage error, said by argparse after the usage line.
    socket = tmp_path / ("s" * (110 - len(str(tmp_path))) + ".sock")
    process = sidecar(socket, tmp_path / "journal")
    _, err = process.communicate(timeout=STARTUP_SECONDS)
    assert process.returncode == 2 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (f"gpu-monitoring sidecar: error: argument --socket: must be a unix socket path "
                                    f"of at most 107 bytes; got '{socket}'")


def test_journal_path_that_is_a_regular_file(tmp_path):
    journal = tmp_path / "journal"
    journal.write_text("not a directory")
    line = refusal(sidecar(tmp_path / "sidecar.sock", journal))
    assert f"--journal {journal}" in line and "not a directory" in line
    assert journal.read_text() == "not a directory"


def test_socket_directory_that_is_a_regular_file(tmp_path):
    (tmp_path / "run").write_text("")
    socket = tmp_path / "run" / "sidecar.sock"
    line = refusal(sidecar(socket, tmp_path / "journal"))
    assert f"--socket {socket}" in line


@pytest.mark.parametrize("directory", ["/proc", "chmod"])
def test_socket_directory_where_no_socket_can_be_made(tmp_path, directory):
    # procfs takes no new files, whoever asks; a directory without write permission stops all but root.
    if directory == "chmod":
        if os.geteuid() == 0:
            pytest.skip("root writes in any directory")
        directory = tmp_path / "run"
        directory.mkdir(mode=0o500)
    socket = f"{directory}/gpu-monitoring-test-sidecar.sock"
    line = refusal(sidecar(socket, tmp_path / "journal"))
    assert f"--socket {socket}" in line


@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary", b"- devices\n", b"8\n"], ids=["binary", "list", "scalar"])
def test_scenario_that_is_no_node(tmp_path, content):
    scenario = tmp_path / "node.yaml"
    scenario.write_bytes(content)
    refusal(sidecar(tmp_path / "sidecar.sock", tmp_path / "journal", scenario), status=2,
            prefix=f"gpu-monitoring sidecar: scenario {scenario}: ")
    assert not (tmp_path / "journal").exists()


def test_journal_held_by_another_sidecar(locked_journal):
    holder, contender = locked_journal
    line = refusal(contender, JOURNAL_WAIT_SECONDS + STARTUP_SECONDS)
    assert "open elsewhere" in line and "another sidecar" in line
    # The holder keeps its journal: it still writes.
    assert holder.append({"kind": "xid"}) == holder.last_seq
