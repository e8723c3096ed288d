"""Every file path of this project that the docs and the code's comments cite exists: a path cited after a
renamed or removed file sends a reader nowhere. Paths of other projects are cited after their repository
(`NVIDIA/gpu-operator assets/state-dcgm-exporter`) or are the installed Datadog base package's. And the
README names every flag the sidecar takes."""

import re
import subprocess
import sys
from pathlib import Path

import datadog_checks.base

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("tests", "gpu_monitoring", "scripts", "deploy", "assets", "docs", "datadog_checks", ".ci")
CITED = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(t) for t in TOP_LEVEL) + r")/[\w./-]*\w)")
# Another repository's path follows its `owner/name`.
OTHER_REPOSITORY = re.compile(r"[\w.-]+/[\w.-]+ $")
DOCS = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "setup.py", "Makefile", "pyproject.toml"]
SOURCES = (".py", ".yaml", ".md", ".sh", ".json", ".txt", ".toml", ".tpl")
INSTALLED = Path(datadog_checks.base.__file__).resolve().parents[1]  # site-packages/datadog_checks


def files():
    yield from (ROOT / name for name in DOCS)
    for top in ("gpu_monitoring", "tests", "scripts", "deploy", "assets", "docs", ".ci"):
        yield from (p for p in (ROOT / top).rglob("*") if p.is_file() and (p.suffix in SOURCES or p.name == "run"))


def exists(path: str) -> bool:
    """In this tree, as a file, directory or the stem of some (`tests/test_attribution` of a glob), or in the
    installed base package."""
    if (ROOT / path).exists() or any((ROOT / path).parent.glob(Path(path).name + "*")):
        return True
    return path.startswith("datadog_checks/") and (INSTALLED.parent / path).exists()


def cited():
    # This file names missing paths on purpose.
    for source in (f for f in files() if f != Path(__file__).resolve()):
        for line in source.read_text(errors="replace").splitlines():
            for match in CITED.finditer(line):
                if not OTHER_REPOSITORY.search(line[: match.start()]):
                    yield source.relative_to(ROOT), match.group(1).rstrip(".")


def test_every_cited_path_exists():
    missing = sorted({f"{source}: {path}" for source, path in cited() if not exists(path)})
    assert missing == []


def test_the_rule_finds_paths_and_refuses_what_is_not():
    found = dict.fromkeys(path for _, path in cited())
    assert "gpu_monitoring/metrics/metrics.yaml" in found and "tests/conftest.py" in found
    assert not exists("tests/test_deploy.py") and not exists("gpu_monitoring/nvml/gone.py")


def test_the_readme_names_every_flag_of_the_sidecar():
    shown = subprocess.run([sys.executable, "-m", "gpu_monitoring.cli", "sidecar", "--help"], capture_output=True,
                           text=True, check=True, cwd=ROOT).stdout
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", shown)) - {"--help"}
    readme = (ROOT / "README.md").read_text()
    assert flags and sorted(flag for flag in flags if f"`{flag}" not in readme) == []
