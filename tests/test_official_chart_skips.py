"""Where the official Datadog chart is not beside the clone, its tests skip, and pytest's summary says
so in one line: how many, why, and where the chart goes."""

import os
import subprocess
import sys
from pathlib import Path

from .deploy_support import DATADOG_CHART, needs_datadog_chart

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_FOR_THE_CHART = 3
# Skipped the way the chart's tests skip where it is missing, beside a test that passes and one that
# skips for another reason.
TESTS = f"""
import pytest

@pytest.mark.skipif(True, reason={needs_datadog_chart.kwargs["reason"]!r})
@pytest.mark.parametrize("n", range({SKIPPED_FOR_THE_CHART}))
def test_rendered(n):
    pass

@pytest.mark.skip(reason="another reason")
def test_other():
    pass

def test_passes():
    pass
"""


def pytest_output(tmp_path, tests):
    (tmp_path / "test_chart_missing.py").write_text(tests)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "--rootdir", str(tmp_path), str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_summary_says_how_many_skipped_for_want_of_the_chart_and_where_it_goes(tmp_path):
    out = pytest_output(tmp_path, TESTS)
    (line,) = [line for line in out.splitlines() if "official Datadog chart" in line]
    assert line.startswith(f"{SKIPPED_FOR_THE_CHART} tests of the official Datadog chart SKIPPED: ")
    assert str(DATADOG_CHART) in line and "DataDog/helm-charts' charts/datadog" in line and "README.md" in line


def test_nothing_is_said_when_no_test_skipped_for_it(tmp_path):
    out = pytest_output(tmp_path, TESTS.replace("skipif(True", "skipif(False"))
    assert "official Datadog chart" not in out
