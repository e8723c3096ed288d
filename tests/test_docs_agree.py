"""The docs say each fact once, from its source: figures from `make bench`'s docs/performance.json,
scenarios from the package, the official chart's version from the copy the tests render, the
sidecar's memory from its measured RSS, assets and service checks from assets/."""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List

import pytest
import yaml

from gpu_monitoring.simulator.scenario import available

from .deploy_support import CHART, DATADOG_CHART
from .scripts_support import import_from_scripts

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PERFORMANCE_JSON = ROOT / "docs" / "performance.json"
headline = import_from_scripts("bench_support.headline")

# Every document a user reads, and the comments of the files they copy from.
DOCS = [README, ROOT / "CHANGELOG.md", ROOT / "Makefile", CHART / "README.md", CHART / "values.yaml",
        CHART / "templates" / "NOTES.txt", ROOT / "deploy" / "helm" / "datadog-values.yaml",
        ROOT / "deploy" / "helm" / "datadog-values-local.yaml", ROOT / "deploy" / "systemd" / "README.md",
        ROOT / "docs" / "RELIABILITY.md"]


# Where prose quotes what `make bench` measured. docs/PERFORMANCE.md is written whole by the run that
# writes docs/performance.json: its tables are checked against the JSON below.
QUOTING = [README, ROOT / "CHANGELOG.md", ROOT / "docs" / "RELIABILITY.md",
           *sorted((ROOT / "deploy" / "helm").glob("**/values*.yaml")),
           *sorted((ROOT / "deploy" / "helm").glob("datadog-values*.yaml"))]


def readme() -> str:
    return README.read_text()


def bench_figures() -> dict:
    return json.loads(PERFORMANCE_JSON.read_text())


def outside_bench_block(text: str) -> str:
    return headline.BLOCK.sub("", text)


def section(text: str, title: str) -> str:
    """A level-2 section of the README, heading excluded."""
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert found, f"README has no section '## {title}'"
    return found.group(1)


def shell_commands(text: str) -> Iterator[str]:
    """Each command of the text's lines, continuation lines joined, comment markers dropped."""
    joined = re.sub(r"\\\n\s*#?\s*", " ", text)
    for line in joined.splitlines():
        yield line.lstrip("# ").strip()


def test_the_readme_quotes_the_last_bench():
    assert headline.quoted(readme()) == headline.readme_block(bench_figures()), (
        "README's figures differ from docs/performance.json: run `make bench`")


@pytest.mark.parametrize("pattern, key", [
    (r"(\d+(?:\.\d+)?) NVML calls per GPU", "nvml_calls_per_gpu"),
    (r"(\d+(?:\.\d+)?)× (?:the|its) (?:submission )?floor", "own_over_floor"),
])
def test_no_doc_quotes_another_figure(pattern, key):
    expected = headline.fmt(bench_figures()["headline"][key])
    for doc in DOCS:
        for figure in re.findall(pattern, outside_bench_block(doc.read_text())):
            assert figure == expected, f"{doc.relative_to(ROOT)} says {figure} where the last bench says {expected}"


def test_how_long_the_bench_takes_is_said_once():
    for doc in DOCS:
        text = outside_bench_block(doc.read_text())
        said = re.findall(r"(?:make bench|bench:)[^\n]*?(\d+) minutes", text, re.S)
        assert not said, f"{doc.relative_to(ROOT)} says `make bench` takes {said} minutes: the README's figures say it"


def test_the_readme_lists_the_packages_scenarios():
    table = section(readme(), "Simulated nodes")
    listed = sorted(re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M))
    assert listed == available()


def test_every_scenario_a_doc_names_exists():
    named = set()
    for doc in DOCS:
        named |= set(re.findall(r"(?:--simulate|SCENARIO=|simulate:)\s*([a-z][a-z0-9-]+)", doc.read_text()))
    assert named and named <= set(available())


def official_chart_version() -> str:
    return yaml.safe_load((DATADOG_CHART / "Chart.yaml").read_text())["version"]


def helm_commands() -> Iterator[tuple]:
    for doc in DOCS:
        for command in shell_commands(doc.read_text()):
            if re.match(r"helm (install|upgrade)\b", command):
                yield doc.relative_to(ROOT), command


@pytest.mark.skipif(not DATADOG_CHART.is_dir(), reason=f"needs the official Datadog chart at {DATADOG_CHART}")
def test_helm_commands_name_a_namespace_and_pin_the_official_chart():
    commands = list(helm_commands())
    assert commands
    for doc, command in commands:
        assert re.search(r"(^| )(-n|--namespace) \S", command), f"{doc}: no namespace in `{command}`"
        if " datadog/datadog" in command:
            assert f"--version {official_chart_version()}" in command, f"{doc}: `{command}` is not pinned"


def test_helm_commands_agree_on_release_names():
    releases = {}
    for _, command in helm_commands():
        words = command.replace("--install", "").split()
        release, chart = words[2], words[3]
        releases.setdefault(chart, set()).add(release)
    assert all(len(names) == 1 for names in releases.values()), releases


def mebibytes(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(Mi|Gi)", quantity).groups()
    return float(number) * (1024 if unit == "Gi" else 1)


def test_the_sidecars_memory_request_covers_its_measured_rss():
    resources = yaml.safe_load((CHART / "values.yaml").read_text())["resources"]
    rss = bench_figures()["headline"]["sidecar_rss_mib"]
    request, limit = mebibytes(resources["requests"]["memory"]), mebibytes(resources["limits"]["memory"])
    assert rss * 1.2 <= request < limit, (rss, request, limit)


def test_the_readme_presents_every_dashboard_and_monitor():
    text = section(readme(), "Dashboards and monitors")
    for path in sorted((ROOT / "assets" / "dashboards").glob("*.json")) + sorted(
            (ROOT / "assets" / "monitors").glob("*.json")):
        assert f"`{path.name}`" in text, f"README's 'Dashboards and monitors' does not present {path.name}"


def test_troubleshooting_covers_every_service_check():
    text = section(readme(), "Troubleshooting")
    for check in json.loads((ROOT / "assets" / "service_checks.json").read_text()):
        assert f"`{check['check']}`" in text


# --- figures of measured quantities, wherever prose quotes them ------------------------------------


def targets(prefix: str) -> Callable[[dict], List[float]]:
    return lambda data: [t["figure"] for t in data["targets"] if t["name"].startswith(prefix)]


def headline_figures(*names: str) -> Callable[[dict], List[float]]:
    return lambda data: [data["headline"][name] for name in names]


@dataclass(frozen=True)
class Quantity:
    """A quantity `make bench` measures, as prose names it: a block of prose (a paragraph, a list item,
    a table row, a comment block) that matches `named`, and not `unless`, quotes it in `unit`; every
    figure it quotes so must be one docs/performance.json holds for the quantity."""

    named: str
    unit: str
    figures: Callable[[dict], List[float]]
    unless: str = r"(?!)"


QUANTITIES = {
    "a DCGM read's CPU": Quantity(
        r"\bDCGM\b|dcgm-exporter", "ms",
        lambda data: targets("CPU a DCGM read")(data) + headline_figures("dcgm_parse_join_ms")(data)),
    "a kubelet refresh's CPU": Quantity(r"kubelet refresh", "ms", targets("CPU per kubelet refresh")),
    # The soak's RSS is the soak's own process, another measurement (docs/RELIABILITY.md says whose).
    "RSS": Quantity(r"\bRSS\b", "MiB", headline_figures(
        "local_mode_check_rss_mib", "sidecar_mode_check_rss_mib", "sidecar_rss_mib"), unless=r"\bsoak"),
    "the runs RSS is measured after": Quantity(r"\bRSS\b", "runs|snapshots", headline_figures("memory_runs"),
                                               unless=r"\bsoak"),
}


def current(doc: Path, text: str) -> str:
    """What of a document speaks for today: the README outside its bench block (rendered from the JSON
    whole), the CHANGELOG's unreleased section (released entries keep the figures of their release)."""
    if doc == README:
        return outside_bench_block(text)
    if doc.name == "CHANGELOG.md":
        return re.split(r"^## \d", text, maxsplit=1, flags=re.M)[0]
    return text


def prose_blocks(doc: Path) -> Iterator[str]:
    """A YAML file's comment blocks; a Markdown file's paragraphs, list items and table rows; each on one line."""
    text = current(doc, doc.read_text())
    if doc.suffix == ".yaml":
        found = [m.group(0).replace("#", " ") for m in re.finditer(r"(?:^[ \t]*#.*\n?)+", text, re.M)]
    else:
        found = [item for paragraph in re.split(r"\n\s*\n", text)
                 for item in re.split(r"\n(?=\s*(?:[*-] |\|))", paragraph)]
    for block in found:
        yield " ".join(block.split())


def quoted_figures() -> Iterator[tuple]:
    for doc in QUOTING:
        for block in prose_blocks(doc):
            for name, quantity in QUANTITIES.items():
                if re.search(quantity.named, block) and not re.search(quantity.unless, block):
                    for figure in re.findall(rf"(\d[\d,]*(?:\.\d+)?) ?(?:{quantity.unit})\b", block):
                        yield doc.relative_to(ROOT), name, figure, block


def test_every_figure_of_a_measured_quantity_is_the_last_benchs():
    data = bench_figures()
    found = list(quoted_figures())
    # Each rule still finds what it is there for: prose that drifts from its wording is seen.
    assert {name for _, name, _, _ in found} == set(QUANTITIES), found
    for doc, name, figure, block in found:
        expected = {headline.fmt(value) for value in QUANTITIES[name].figures(data)}
        assert figure in expected, f"{doc} quotes {name} as {figure}; the last bench: {sorted(expected)}: {block}"


def test_performance_md_is_the_run_that_wrote_the_json():
    data = bench_figures()
    text = (ROOT / "docs" / "PERFORMANCE.md").read_text()
    rows = re.findall(r"^\| (.+) \| (\S+) \| (.+) \| (PASS|FAIL) \|$", text.split("## Targets")[1].split("\n## ")[0],
                      re.M)
    assert rows == [(t["name"], headline.fmt(t["figure"]), t["limit"], t["verdict"]) for t in data["targets"]]
    figures = data["headline"]
    runs = f"{figures['memory_runs']} runs"
    assert f"| sidecar process after {runs} | {headline.fmt(figures['sidecar_rss_mib'])} |" in text
    assert f"| check process after {runs} | {headline.fmt(figures['sidecar_mode_check_rss_mib'])} |" in text
    parse_and_join = headline.fmt(figures["dcgm_parse_join_ms"])
    assert f"parse and join alone; NVML gives PCIe and NVLink throughput | {parse_and_join} |" in text


def test_released_figures_are_marked_as_theirs():
    released = re.split(r"^## \d", (ROOT / "CHANGELOG.md").read_text(), maxsplit=1, flags=re.M)[1]
    assert "keep the figures measured at their release" in released.split("\n* ")[0]

