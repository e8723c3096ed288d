"""`scripts/bench_versus.py` on a few rounds, this tree against its own last commit: both versions'
figures are printed, each child imported gpu_monitoring from its own tree, and the temporary worktree
is gone afterwards. Then the arithmetic behind the figures, on known numbers.

No verdict is asserted: timings flake, and the script prints PASS or FAIL itself.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .scripts_support import import_from_scripts

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ("base", "head")

versus = import_from_scripts("bench_support.versus")
interleaving = import_from_scripts("bench_support.interleave")


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> dict:
    figures = tmp_path_factory.mktemp("versus") / "versus.json"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_versus.py"), "--base", "HEAD",
                             "--rounds", "4", "--batch", "2", "--json", str(figures)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"stdout": result.stdout, "figures": json.loads(figures.read_text())}


def test_both_versions_figures_are_printed(compared):
    rows = [line.split() for line in compared["stdout"].splitlines() if line.startswith(("  base: ", "  head: "))]
    assert [row[0] for row in rows] == ["base:", "head:"]
    for name in VERSIONS:
        figures = compared["figures"]["versions"][name]
        assert figures["rounds"] == 4
        assert figures["own_ms"] > 0 and figures["floor_ms"] > 0 and figures["series"] > 0
        assert figures["ratio_own"] == pytest.approx(
            (figures["own_ms"] / figures["series"]) / (figures["floor_ms"] / figures["floor_series"]))
    assert "head vs base, own/floor per series: " in compared["stdout"]
    assert "pairwise, the median over 2 pairs" in compared["stdout"]


def test_each_child_imports_gpu_monitoring_from_its_own_tree(compared):
    base, head = (compared["figures"]["versions"][name] for name in VERSIONS)
    assert Path(head["root"]) == ROOT
    assert Path(base["root"]) != ROOT
    for version in (base, head):
        assert Path(version["gpu_monitoring"]) == Path(version["root"]) / "gpu_monitoring" / "__init__.py"
        assert f"gpu_monitoring from {version['gpu_monitoring']}" in compared["stdout"]


def test_the_temporary_worktree_is_removed(compared):
    base = compared["figures"]["versions"]["base"]["root"]
    assert not Path(base).parent.exists()
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list", "--porcelain"],
                            capture_output=True, text=True, check=True).stdout
    assert base not in listed


def test_turns_alternate_which_version_goes_first_and_end_with_the_rounds():
    assert list(versus.turns(5, 2)) == [("base", 2), ("head", 2), ("head", 2), ("base", 2), ("base", 1), ("head", 1)]


def test_figures_from_known_runs():
    runs = versus.Runs(cpu=[0.008, 0.009, 0.010], own=[0.004, 0.006, 0.005], own_and_entry=[0.005, 0.006, 0.007],
                       floor=[0.003, 0.002, 0.0025], series=[400, 400, 432])
    comparison = runs.comparison(floor_series=400)
    assert (comparison.own_ms, comparison.floor_ms, comparison.series, comparison.rounds) == (
        pytest.approx(5), pytest.approx(2.5), 432, 3)
    assert comparison.ratio_own == pytest.approx((5 / 432) / (2.5 / 400))
    assert versus.difference_percent(1.545, 1.5) == pytest.approx(3)
    # Pairs of (head, base): 1.03, 0.99 and 1.1 times; the median is 1.03.
    assert versus.pairwise_percent([(1.03, 1.0), (0.99, 1.0), (2.2, 2.0)]) == pytest.approx(3)
    assert (versus.verdict(3.0, 3), versus.verdict(3.01, 3)) == ("PASS", "FAIL")


def test_interleaving_alternates_and_batches_continue_it():
    order = []

    def measure(name):
        return lambda: order.append(name) or len(order)

    firsts, seconds = interleaving.interleave(3, measure("check"), measure("floor"))
    assert order == ["floor", "check", "check", "floor", "floor", "check"]
    assert (firsts, seconds) == ([2, 3, 6], [1, 4, 5])
    order.clear()
    interleaving.interleave(2, measure("check"), measure("floor"))
    interleaving.interleave(1, measure("check"), measure("floor"), start=2)
    assert order == ["floor", "check", "check", "floor", "floor", "check"]
