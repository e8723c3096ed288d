"""`scripts/bench.py` on tiny settings: every section is printed, every figure is a finite number,
and the Markdown (and the plot, where matplotlib is installed) is written where --out says.

No performance target is asserted: the script prints PASS or FAIL itself, and timings flake.
"""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--runs", "12", "--trace-runs", "4", "--rounds", "3", "--calls-runs", "2", "--scaling-runs", "2",
        "--profile-runs", "3", "--max-processes", "10", "--kube-ttl", "0.1", "--scenario", "t4-shared"]
SECTIONS = ["1. NVML calls", "2. CPU per series against the submission floor", "3. Profile",
            "4. Scaling", "5. Memory", "6. A full node's kubelet", "Targets"]


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), *TINY, "--out", str(out),
                             "--json", str(out / "bench.json")],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"out": out, "stdout": result.stdout, "figures": json.loads((out / "bench.json").read_text())}


def test_every_section_is_printed_and_written(bench):
    markdown = (bench["out"] / "PERFORMANCE.md").read_text()
    for title in SECTIONS:
        assert f"== {title}" in bench["stdout"]
        assert f"## {title}" in markdown
    assert "Python " in markdown and "CPU: " in markdown


def test_every_target_is_judged(bench):
    assert "PASS" in bench["stdout"] or "FAIL" in bench["stdout"]
    targets = bench["figures"]["targets"]
    assert {t["name"].split(",")[0] for t in targets} >= {
        "NVML calls per GPU per run counting every call",
        "CPU per series over the floor", "own CPU per run",
        "kubelet requests per pod_cache_ttl", "pod-resources calls per run",
        "/proc reads per run for processes seen before"}
    for target in targets:
        assert isinstance(target["ok"], bool)
        assert math.isfinite(target["figure"]) and target["figure"] >= 0


def test_figures_are_finite_and_cpu_positive(bench):
    assert all(math.isfinite(n) for n in _numbers(bench["figures"]["sections"]))
    curves = bench["figures"]["curves"]
    assert set(curves) == {"GPUs", "processes", "pods", "MIG instances"}
    for curve in curves.values():
        assert curve["total"] and all(ms > 0 for ms in curve["total"] + curve["own"])


def test_the_plot_is_written_where_matplotlib_is(bench):
    plot = bench["out"] / "performance.png"
    if importlib.util.find_spec("matplotlib") is None:
        assert not plot.exists() and "no plot" in bench["stdout"]
    else:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _numbers(value: Any) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _numbers(item)
