"""The bench's headline figures: kept in docs/performance.json and quoted in the README between markers.

`make bench` writes both; tests/test_docs_agree.py renders the README's block again from the JSON,
so the README can quote no figure the last bench did not measure.
"""

import json
import re
from pathlib import Path
from typing import Any, Dict, Optional

from .report import HEADLINE_SCENARIO, Report, fmt

START, END = "<!-- bench:start -->", "<!-- bench:end -->"
BLOCK = re.compile(re.escape(START) + r"\n(.*?)" + re.escape(END), re.S)


def figures(report: Report, elapsed: float, machine: str) -> Dict[str, Any]:
    return {
        "scenario": HEADLINE_SCENARIO,
        "machine": machine,
        "wall_minutes": round(elapsed / 60),
        "headline": dict(report.headline),
        "targets": [{"name": t.name, "figure": t.figure, "limit": t.limit, "verdict": t.verdict}
                    for t in report.targets],
    }


def readme_block(data: Dict[str, Any]) -> str:
    """The README's overhead table and the bench's targets, from the figures of one bench run."""
    h = data["headline"]
    node = f"`{data['scenario']}`"
    rows = [
        (f"NVML calls per GPU per run, {node}, default `metrics_profile`", fmt(h["nvml_calls_per_gpu"])),
        (f"series per run, {node}, default `metrics_profile`", fmt(h["series_per_run"])),
        (f"the check's own CPU per run, {node}",
         f"{fmt(h['own_ms_per_run'])} ms; {fmt(h['own_over_floor'])}× the {fmt(h['floor_ms_per_run'])} ms that "
         "submitting the same series costs an empty `AgentCheck`"),
        (f"RSS after {fmt(int(h['memory_runs']))} runs: the check in local mode; in sidecar mode, the check and "
         "the sidecar",
         f"{fmt(h['local_mode_check_rss_mib'])} MiB; {fmt(h['sidecar_mode_check_rss_mib'])} MiB and "
         f"{fmt(h['sidecar_rss_mib'])} MiB"),
        ("`make bench`'s wall time", f"about {data['wall_minutes']} minutes ({data['machine']})"),
    ]
    lines = ["| figure | value |", "|---|---|"] + [f"| {name} | {value} |" for name, value in rows]
    lines += ["", "| target | figure | limit | verdict |", "|---|--:|--:|--:|"]
    lines += [f"| {t['name']} | {fmt(t['figure'])} | {t['limit']} | {t['verdict']} |" for t in data["targets"]]
    return "\n".join(lines) + "\n"


def write(data: Dict[str, Any], json_path: Path, readme: Optional[Path]) -> None:
    json_path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    if readme is None:
        return
    text = readme.read_text()
    if BLOCK.search(text):
        readme.write_text(BLOCK.sub(lambda _: f"{START}\n{readme_block(data)}{END}", text, count=1))


def quoted(readme_text: str) -> str:
    """The block the README holds now ("" without one)."""
    found = BLOCK.search(readme_text)
    return found.group(1) if found else ""
