"""An Agent's embedded Python and its `integration install -w`, as the Agent does them.

The Agent (7.72 and newer) embeds Python 3.13 with `datadog-checks-base[deps]`, and freezes what it
ships into `<root>/final_constraints-py3.txt`. `datadog-agent integration install -w <wheel>`:
- accepts the wheel if a line of its METADATA contains `Requires-Dist: datadog-checks-base`, and
  takes the package name from its `Name:` line;
- runs `<python> -mpip install --constraint <root>/final_constraints-py3.txt --no-cache-dir
  --no-index --no-deps <wheel> --disable-pip-version-check`: no dependency is installed;
- copies every file of `<site-packages>/datadog_checks/<check>/data/` whose name matches
  `[\\w_]+\\.yaml.*` to `<conf.d>/<check>.d/` (check = the package name without `datadog-`, `-`
  turned to `_`), and fails when that folder is missing.

Here an "Agent root" is a folder holding `embedded/` (a Python 3.13 virtualenv with only
`datadog-checks-base[deps]`), `final_constraints-py3.txt` (its `pip freeze`) and `conf.d/`. A
clean root is built once per base version (`.venv-agent-<version>/`) and copied for each test.

    python -m tests.agent_support      # an install transcript, then a run in each mode
"""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).with_name("agent_runner.py")
AGENT_PYTHON_VERSION = "3.13.0"

# datadog-checks-base releases whose pinned `deps` stand for an Agent's embedded packages:
# 37.21.0 is the first for Agents on Python 3.13 (7.72); 38.5.0 the newest whose pins all resolve
# from the package index (38.6.0 and later pin a certifi the index does not have yet).
BASE_VERSIONS = ("37.21.0", "38.5.0")

_YAML_FILE = re.compile(r"[\w_]+\.yaml.*")
_METADATA_NAME = re.compile(r"Name: (\S+)")


class InstallError(Exception):
    """`integration install` refused the wheel or failed; the message is what the Agent would print."""


def agent_python() -> str:
    """Python 3.13 as the machines have it: `AGENT_PYTHON`, else pyenv's 3.13.0, else `python3.13`."""
    candidates = [os.environ.get("AGENT_PYTHON")]
    pyenv_root = os.environ.get("PYENV_ROOT") or _pyenv_root()
    if pyenv_root:
        candidates.append(os.path.join(pyenv_root, "versions", AGENT_PYTHON_VERSION, "bin", "python3.13"))
    candidates.append(shutil.which("python3.13"))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(f"no Python 3.13 found (tried {', '.join(c for c in candidates if c)}): "
                       f"install it with `pyenv install {AGENT_PYTHON_VERSION}` or set AGENT_PYTHON")


def _pyenv_root() -> Optional[str]:
    pyenv = shutil.which("pyenv")
    if not pyenv:
        default = Path.home() / ".pyenv"
        return str(default) if default.is_dir() else None
    return subprocess.run([pyenv, "root"], capture_output=True, text=True, check=True).stdout.strip()


def clean_agent_root(base_version: str) -> Path:
    """`.venv-agent-<version>/`: an Agent root with nothing installed beyond the base and its deps."""
    root = ROOT / f".venv-agent-{base_version}"
    stamp = root / ".installed"
    if stamp.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    _run([agent_python(), "-m", "venv", str(root / "embedded")])
    python = str(root / "embedded" / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
          f"datadog-checks-base[deps]=={base_version}"])
    frozen = _run([python, "-m", "pip", "freeze", "--disable-pip-version-check"])
    (root / "final_constraints-py3.txt").write_text(frozen)
    stamp.write_text(base_version)
    return root


def agent_root(base_version: str, directory: Path) -> Path:
    """A fresh copy of the clean Agent root, in `directory`, with an empty conf.d."""
    copy = directory / "datadog-agent"
    shutil.copytree(clean_agent_root(base_version), copy, symlinks=True)
    (copy / "conf.d").mkdir()
    return copy


def build_wheel(directory: Path) -> Path:
    """This repository as a wheel, as `pip wheel` builds it for release."""
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "--disable-pip-version-check", "-w", str(directory), str(ROOT)])
    (wheel,) = directory.glob("datadog_gpu_monitoring-*.whl")
    return wheel


def integration_install(root: Path, wheel: Path) -> List[str]:
    """`datadog-agent integration install -w <wheel>` against an Agent root; the lines it prints."""
    metadata = _wheel_metadata(wheel)
    if not any("Requires-Dist: datadog-checks-base" in line for line in metadata):
        raise InstallError(f"the wheel {wheel} is not an agent check, it will not be installed")
    name = next((m.group(1) for m in map(_METADATA_NAME.search, metadata) if m), None)
    if name is None:
        raise InstallError(f"package name not found in wheel: {wheel}")
    name = name.replace("_", "-")
    command = [str(python(root)), "-mpip", "install", "--constraint", str(root / "final_constraints-py3.txt"),
               "--no-cache-dir", "--no-index", "--no-deps", str(wheel), "--disable-pip-version-check"]
    transcript = ["$ " + " ".join(command)]
    result = subprocess.run(command, capture_output=True, text=True)
    transcript += (result.stdout + result.stderr).splitlines()
    if result.returncode:
        raise InstallError(f"error installing wheel {wheel}:\n" + "\n".join(transcript))
    transcript += _copy_configuration(root, name)
    transcript.append(f"Successfully completed the installation of {name}")
    return transcript


def _copy_configuration(root: Path, package: str) -> List[str]:
    check = package[len("datadog-"):].replace("-", "_") if package.startswith("datadog-") else package
    source = site_packages(root) / "datadog_checks" / check / "data"
    if not source.is_dir():
        raise InstallError(f"Some errors prevented moving {package} configuration files: "
                           f"open {source}: no such file or directory")
    destination = root / "conf.d" / f"{check}.d"
    destination.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in sorted(source.iterdir()):
        if path.is_file() and _YAML_FILE.search(path.name):
            shutil.copyfile(path, destination / path.name)
            copied.append(f"Successfully copied configuration file {path.name}")
    return copied


def _wheel_metadata(wheel: Path) -> List[str]:
    with zipfile.ZipFile(wheel) as archive:
        (member,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(member).decode().splitlines()


def python(root: Path) -> Path:
    return root / "embedded" / "bin" / "python"


def site_packages(root: Path) -> Path:
    out = _run([str(python(root)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    return Path(out.strip())


def run_check(root: Path, instances: List[Dict[str, Any]], runs: int = 1, check: str = "gpu_monitoring") -> dict:
    """Write conf.d/<check>.d/conf.yaml with `instances` and run them in the Agent's Python."""
    import yaml

    (root / "conf.d" / f"{check}.d" / "conf.yaml").write_text(
        yaml.safe_dump({"init_config": {}, "instances": instances}))
    # The Agent runs checks with its own environment, not the test's virtualenv.
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    out = _run([str(python(root)), str(RUNNER), str(root / "conf.d"), check, str(runs)], env=env, cwd=str(root))
    return json.loads(out)


def _run(command: List[str], **kwargs) -> str:
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def _print_run(title: str, report: dict) -> None:
    run = report["runs"][-1]
    print(f"# {title}: loaded {report['class']} {report['version']} from {report['module']} "
          f"(Python {report['python']}); {len(run['metrics'])} series, error: {run['error']}")
    for check in sorted(run["service_checks"], key=lambda c: c["name"]):
        print(f"  {check['name']} {check['status']} {check['message'] or ''}".rstrip())
    for record in report["logs"]:
        print(f"  log {record['level']}: {record['message']}")


if __name__ == "__main__":
    import tempfile

    from .sidecar_support import SidecarProcess

    with tempfile.TemporaryDirectory() as tmp:
        base = BASE_VERSIONS[-1]
        agent = agent_root(base, Path(tmp))
        print(f"# Agent root: Python {AGENT_PYTHON_VERSION}, datadog-checks-base[deps]=={base}")
        print("\n".join(integration_install(agent, build_wheel(Path(tmp) / "dist"))))
        print("$ ls conf.d/gpu_monitoring.d/")
        print("\n".join(sorted(p.name for p in (agent / "conf.d" / "gpu_monitoring.d").iterdir())))
        sidecar = SidecarProcess(Path(tmp), "dgx-h100").start()
        try:
            _print_run("sidecar mode", run_check(agent, [{"source": "sidecar", "sidecar_socket": sidecar.socket,
                                                          "kubernetes": False}]))
        finally:
            sidecar.stop()
        _print_run("local mode", run_check(agent, [{"source": "local", "kubernetes": False}], runs=2))
