"""The sidecar, the simulator and the NVML, Kubernetes and DCGM code import and run without the Datadog
Agent's base package (`datadog_checks.base`), as the sidecar's image and systemd unit install them.

A virtualenv of its own (`.venv-sidecar/`, no system site-packages) holds this project and its
`sidecar` extra from the package index, nothing else: each package imports there in a fresh
interpreter without loading `datadog_checks`, and the sidecar serves a simulated node. The virtualenv
is built once for each setup.py (and the __about__.py whose pins it reads); the project is installed
editable, so what runs is this tree's code.
"""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from datadog_checks.base.constants import ServiceCheck

from gpu_monitoring import __about__
from gpu_monitoring.status import Status

from .sidecar_support import SidecarProcess

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".venv-sidecar"
INSTALL_SECONDS = 600
# `package.*`: the package and every module in it.
PACKAGES = [
    "gpu_monitoring.sidecar",
    "gpu_monitoring.sidecar.app",
    "gpu_monitoring.sidecar.command",
    "gpu_monitoring.simulator",
    "gpu_monitoring.nvml",
    "gpu_monitoring.kube.*",
    "gpu_monitoring.dcgm.*",
    "gpu_monitoring.node",
    "gpu_monitoring.snapshot",
    "gpu_monitoring.metrics.spec",
]
# Imports what it is given and prints the `datadog_checks` modules loaded (none, where all is well).
IMPORT = """
import importlib, json, pkgutil, sys
name = sys.argv[1]
package = importlib.import_module(name.removesuffix(".*"))
if name.endswith(".*"):
    for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "datadog_checks")))
"""


def _key() -> str:
    digest = hashlib.sha256(sys.version.encode())
    for path in (ROOT / "setup.py", ROOT / "gpu_monitoring" / "__about__.py"):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _run(args: List[str], **options) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, env=_environment(), **options)
    assert result.returncode == 0, f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
    return result


def _environment() -> dict:
    """This environment without what would lead an interpreter to packages outside its virtualenv."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**environment, "PYTHONNOUSERSITE": "1"}


@pytest.fixture(scope="module")
def venv() -> Path:
    """`.venv-sidecar/venv`, built when setup.py changed; a run building it makes another wait."""
    venv, key = CACHE / "venv", _key()
    stamp = venv / ".installed"
    CACHE.mkdir(exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists() or stamp.read_text() != key:
            shutil.rmtree(venv, ignore_errors=True)
            _run([sys.executable, "-m", "venv", str(venv)], timeout=INSTALL_SECONDS)
            _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                  "-e", f"{ROOT}[sidecar]"], timeout=INSTALL_SECONDS)
            stamp.write_text(key)
    return venv


def test_the_virtualenv_has_the_sidecars_packages_and_no_agent_base(venv):
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    modules = ["datadog_checks.base", *__about__.DEPS, *__about__.SIDECAR_DEPS]
    probe = f"import importlib.util as u; print([m for m in {modules!r} if u.find_spec(m)])"
    out = _run([str(venv / "bin" / "python"), "-c", probe], cwd=venv).stdout
    assert out.strip() == repr(modules[1:]), out


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_without_the_agent_base(venv, package):
    # Run outside the repository, so that the install is what is imported.
    out = _run([str(venv / "bin" / "python"), "-c", IMPORT, package], cwd=venv).stdout
    assert json.loads(out) == [], out


def test_the_sidecar_command_answers_help(venv):
    out = _run([str(venv / "bin" / "gpu-monitoring"), "sidecar", "--help"], cwd=venv).stdout
    assert out.startswith("usage: gpu-monitoring sidecar") and "--simulate" in out, out


def test_the_sidecar_serves_a_simulated_node(venv, tmp_path):
    sidecar = SidecarProcess(tmp_path, "dgx-h100", "--log-level", "WARNING", python=str(venv / "bin" / "python"))
    sidecar.start(cwd=tmp_path, env=_environment())
    try:
        snapshot = sidecar.client().snapshot()
    finally:
        assert sidecar.stop() == 0, sidecar.log_text()
    assert len(snapshot.devices) == 8 and all("H100" in d.name for d in snapshot.devices), snapshot.devices


def test_the_statuses_are_the_agents_own():
    """The sidecar's Status is written without the base; the check sends it to the Agent as it is."""
    assert [Status.OK, Status.WARNING, Status.CRITICAL] == [ServiceCheck.OK, ServiceCheck.WARNING,
                                                           ServiceCheck.CRITICAL]
