"""A reader that stops early (`gpu-monitoring check ... | head -2`) gets what it read and no traceback:
the command exits 141, as a shell reports a command that SIGPIPE ended."""

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_monitoring.cli.main import CLOSED_PIPE

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("output", [["--json"], ["--series"]])
def test_a_pipe_closed_early_ends_the_command_quietly(output):
    # dgx-h100's series are hundreds of KiB: far more than a pipe holds, so the writer meets the closed end.
    process = subprocess.Popen([sys.executable, "-m", "gpu_monitoring.cli", "check", "--simulate", "dgx-h100",
                                *output], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = process.stdout.readline()
        process.stdout.close()
        errors = process.stderr.read().decode()
        code = process.wait(timeout=120)
    finally:
        process.kill()
    assert first.strip() in (b"{", b"=== GPUs (8) ===")
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors
    assert code == CLOSED_PIPE == 141


def test_through_a_shell_pipeline_into_head():
    command = f"{sys.executable} -m gpu_monitoring.cli check --simulate dgx-h100 --series | head -2"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.splitlines()[0] == "=== GPUs (8) ===" and len(done.stdout.splitlines()) == 2
    assert done.stderr == ""
    assert done.returncode == CLOSED_PIPE
