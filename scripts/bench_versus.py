"""Compare two versions of the code on the check's own CPU per series over the submission floor, in one run.

    python scripts/bench_versus.py --base REV [--head PATH_OR_REV] [--scenario NAME] [--metrics-profile NAME]
                                   [--rounds N]
                                   [--batch N] [--limit PERCENT] [--json FILE]

Each version is measured by a child process of its own, in its own tree (a revision is checked out
into a temporary git worktree, removed at the end): the check and its floor set up as `make bench`
sets them up, then rounds of one check run and one floor run. The children take turns of --batch
rounds (base, head, head, base, …) until each has run --rounds. Prints per version the check's own
ms per run, the floor's, the series per run and own CPU per series over the floor, then head's
difference to base on that figure, overall and pairwise, PASS or FAIL against --limit; exits 0 either way.
"""

import argparse
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_support.checkout import checked_out, commit_of  # noqa: E402
from bench_support.report import Section, Table, text  # noqa: E402
from bench_support.versions import Version  # noqa: E402
from bench_support.versus import BASE, HEAD, difference_percent, pairwise_percent, turns, verdict  # noqa: E402


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the code before the change: any git revision")
    parser.add_argument("--head", help="the code after it: a tree's path or a git revision (default: this tree)")
    parser.add_argument("--scenario", default="dgx-h100", help="the simulated node (default dgx-h100)")
    parser.add_argument("--metrics-profile", default="standard",
                        help="the instance's metrics_profile (default standard; the CPU bar is set on full)")
    parser.add_argument("--rounds", type=int, default=200, help="rounds per version (default 200)")
    parser.add_argument("--batch", type=int, default=10, help="rounds per turn (default 10)")
    parser.add_argument("--limit", type=float, default=3.0,
                        help="most percent head may be above base (default 3)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> None:
    args = parse(argv)
    # Terminated like interrupted: the children stopped and the worktrees removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with contextlib.ExitStack() as stack:
        trees = {BASE: _tree(stack, args.base), HEAD: _head(stack, args.head)}
        versions = {name: stack.enter_context(Version(name, label, root, args.scenario, args.metrics_profile))
                    for name, (label, root) in trees.items()}
        for version in versions.values():
            print(f"{version.name}: {version.label}, gpu_monitoring from {version.module}", flush=True)
        pairs = _turns(versions, args.rounds, args.batch)
    figures = _figures(args, versions, pairs)
    print(text(_section(args, figures)))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")


def _head(stack: contextlib.ExitStack, head: Optional[str]) -> Tuple[str, Path]:
    if head is None:
        return f"{ROOT} (the working tree)", ROOT
    if os.path.isdir(head):
        return head, Path(head)
    return _tree(stack, head)


def _tree(stack: contextlib.ExitStack, revision: str) -> Tuple[str, Path]:
    return f"{revision} ({commit_of(ROOT, revision)})", stack.enter_context(checked_out(ROOT, revision))


def _turns(versions: Dict[str, Version], rounds: int, batch: int) -> List[Tuple[float, float]]:
    """Runs every turn; returns (head, base) own CPU per series over the floor of each pair of adjacent turns."""
    pairs, pair = [], {}
    for name, size in turns(rounds, batch):
        version = versions[name]
        pair[name] = version.run(size).comparison(version.floor_series).ratio_own
        if len(pair) == 2:
            pairs.append((pair[HEAD], pair[BASE]))
            pair = {}
    return pairs


def _figures(args: argparse.Namespace, versions: Dict[str, Version],
             pairs: List[Tuple[float, float]]) -> Dict[str, Any]:
    each = {name: _version_figures(version) for name, version in versions.items()}
    overall = difference_percent(each[HEAD]["ratio_own"], each[BASE]["ratio_own"])
    pairwise = pairwise_percent(pairs)
    return {
        "scenario": args.scenario, "metrics_profile": args.metrics_profile, "rounds": args.rounds,
        "batch": args.batch, "limit_percent": args.limit,
        "versions": each,
        "difference_percent": overall, "verdict": verdict(overall, args.limit),
        "pairwise_percent": pairwise, "pairwise_verdict": verdict(pairwise, args.limit), "pairs": len(pairs),
    }


def _version_figures(version: Version) -> Dict[str, Any]:
    c = version.runs.comparison(version.floor_series)
    return {"label": version.label, "root": str(version.root), "gpu_monitoring": str(version.module),
            "own_ms": c.own_ms, "cpu_ms": c.cpu_ms, "floor_ms": c.floor_ms, "series": c.series,
            "floor_series": c.floor_series, "ratio_own": c.ratio_own, "rounds": c.rounds}


def _section(args: argparse.Namespace, figures: Dict[str, Any]) -> Section:
    table = Table(f"{args.scenario}, metrics_profile {args.metrics_profile}: {args.rounds} rounds per version, "
                  f"in turns of {args.batch}",
                  ["version", "check own ms/run", "floor ms/run", "series/run", "own/floor per series"])
    for name, v in figures["versions"].items():
        table.rows.append([f"{name}: {v['label']}", f"{v['own_ms']:.3f}", f"{v['floor_ms']:.3f}",
                           v["series"], f"{v['ratio_own']:.4f}"])
    limit = f"limit +{args.limit:g} %"
    table.notes += [
        f"head vs base, own/floor per series: {figures['difference_percent']:+.2f} % ({limit}) "
        f"{figures['verdict']}",
        f"pairwise, the median over {figures['pairs']} pairs of adjacent turns of head's over base's: "
        f"{figures['pairwise_percent']:+.2f} % ({limit}) {figures['pairwise_verdict']}",
    ]
    return Section("Own CPU per series over the floor, two versions interleaved", [table])


if __name__ == "__main__":
    main()
