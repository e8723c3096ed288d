"""The wheel installed and run as the Datadog Agent does it (tests/agent_support.py): Python 3.13
holding only datadog-checks-base[deps], `integration install -w` with no dependencies, the check
loaded as `datadog_checks.gpu_monitoring` and run in sidecar mode against a real sidecar and in
local mode without the packages the Agent lacks."""

import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpu_monitoring import __about__
from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.deps import install_command
from gpu_monitoring.simulator.kubelet_server import KubeletServer
from gpu_monitoring.simulator.pod_resources_server import PodResourcesServer

from . import agent_support as agent
from .sidecar_support import SidecarProcess

NVML_CHECK = "gpu_monitoring.nvml.can_connect"
KUBELET_CHECK = "gpu_monitoring.kubelet.can_connect"
SIDECAR_CHECK = "gpu_monitoring.sidecar.can_connect"
OK, WARNING, CRITICAL = 0, 1, 2


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return agent.build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module", params=agent.BASE_VERSIONS, ids=lambda v: f"base-{v}")
def installed(request, wheel, tmp_path_factory):
    """An Agent root of one base version with the wheel installed by `integration install -w`."""
    root = agent.agent_root(request.param, tmp_path_factory.mktemp("agent"))
    before = _frozen(root)
    transcript = agent.integration_install(root, wheel)
    return SimpleNamespace(root=root, base=request.param, wheel=wheel, before=before, transcript=transcript)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    process = SidecarProcess(tmp_path_factory.mktemp("sidecar"), "dgx-h100").start()
    yield process
    process.stop()


def _frozen(root):
    out = subprocess.run([str(agent.python(root)), "-m", "pip", "list", "--format=freeze",
                          "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.splitlines())


def _service_checks(run, name):
    return [sc for sc in run["service_checks"] if sc["name"] == name]


# --- install ----------------------------------------------------------------------------------


def test_install_adds_only_the_check_and_copies_its_example(installed):
    root, before, transcript = installed.root, installed.before, installed.transcript
    assert transcript[0].split()[2:] == [
        "-mpip", "install", "--constraint", str(root / "final_constraints-py3.txt"),
        "--no-cache-dir", "--no-index", "--no-deps", str(installed.wheel), "--disable-pip-version-check"]
    assert "Successfully copied configuration file conf.yaml.example" in transcript
    assert _frozen(root) - before == {f"datadog-gpu-monitoring=={__about__.__version__}"}
    assert before - _frozen(root) == set()
    copied = root / "conf.d" / "gpu_monitoring.d" / "conf.yaml.example"
    assert copied.read_text() == (agent.ROOT / "datadog_checks" / "gpu_monitoring" / "data" /
                                  "conf.yaml.example").read_text()


def test_the_agent_python_lacks_local_modes_packages(installed):
    probe = "import importlib.util as u; print([m for m in ('pynvml', 'grpc') if u.find_spec(m)])"
    out = subprocess.run([str(agent.python(installed.root)), "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_wheel_without_data_is_refused_after_pip(installed, tmp_path):
    broken = _rewrite_wheel(installed.wheel, tmp_path, drop="datadog_checks/gpu_monitoring/data/")
    fresh = agent.agent_root(installed.base, tmp_path)
    with pytest.raises(agent.InstallError, match="configuration files"):
        agent.integration_install(fresh, broken)


def test_a_wheel_that_needs_pynvml_to_load_fails_to_load(installed, tmp_path):
    broken = _rewrite_wheel(installed.wheel, tmp_path, prepend={"gpu_monitoring/check.py": "import pynvml\n"})
    fresh = agent.agent_root(installed.base, tmp_path)
    agent.integration_install(fresh, broken)
    with pytest.raises(RuntimeError, match="could not load the check.*pynvml"):
        agent.run_check(fresh, [{"source": "sidecar"}])


# --- sidecar mode: nothing added to the Agent -------------------------------------------------


def test_sidecar_mode_runs_in_a_stock_agent(installed, sidecar):
    root = installed.root
    instance = {"source": "sidecar", "sidecar_socket": sidecar.socket, "kubernetes": False}
    report = agent.run_check(root, [instance], runs=2)

    assert report["module"] == "datadog_checks.gpu_monitoring"
    assert report["class"] == "gpu_monitoring.check.GpuMonitoringCheck"
    assert report["version"] == __about__.__version__
    assert report["python"].startswith("3.13")
    assert Path(report["module_file"]).is_relative_to(root)
    assert report["imported"] == []
    assert report["logs"] == []
    for run in report["runs"]:
        assert run["error"] is None
        assert [sc["status"] for sc in _service_checks(run, SIDECAR_CHECK)] == [OK]
        assert [sc["status"] for sc in _service_checks(run, NVML_CHECK)] == [OK]
        assert len(_service_checks(run, "gpu_monitoring.device.health")) == 8
        (count,) = [m for m in run["metrics"] if m["name"] == "gpu_monitoring.devices.count"]
        assert count["value"] == 8
        assert len([m for m in run["metrics"] if m["name"] == "gpu_monitoring.utilization.gpu"]) == 8
    # The same metrics as the check gives in a full environment from the same sidecar.
    assert _metric_names(report["runs"][-1]) == _metric_names_in_process(instance)


def _metric_names(run):
    return {m["name"] for m in run["metrics"]}


def _metric_names_in_process(instance):
    from datadog_checks.base.stubs import aggregator

    check = GpuMonitoringCheck("gpu_monitoring", {}, [instance])
    for _ in range(2):
        aggregator.reset()
        check.run()
    names = set(aggregator._metrics)
    aggregator.reset()
    return names


# --- local mode without pynvml and grpcio ------------------------------------------------------


@pytest.fixture
def kubernetes(tmp_path):
    """A real HTTPS kubelet and pod-resources socket, as on a Kubernetes node."""
    with KubeletServer(directory=str(tmp_path)) as kubelet:
        kubelet.write_token_file()
        with PodResourcesServer(str(tmp_path / "kubelet.sock")) as pod_resources:
            yield {
                "kubernetes": True,
                "kubelet_url": kubelet.url,
                "kubelet_token_path": kubelet.token_path,
                "kubelet_ca_path": kubelet.ca_path,
                "pod_resources_socket": pod_resources.socket_path,
            }


def test_local_mode_names_the_missing_packages_and_how_to_add_them(installed, kubernetes):
    report = agent.run_check(installed.root, [dict(kubernetes, source="local")], runs=3)

    for run in report["runs"]:
        assert run["error"] is None
        (nvml,) = _service_checks(run, NVML_CHECK)
        assert nvml["status"] == CRITICAL
        assert "nvidia-ml-py" in nvml["message"] and install_command("pynvml") in nvml["message"]
        (kubelet,) = _service_checks(run, KUBELET_CHECK)
        assert kubelet["status"] == WARNING
        assert "pod-resources" in kubelet["message"] and install_command("grpc") in kubelet["message"]
        assert "--constraint /opt/datadog-agent/final_constraints-py3.txt" in install_command("grpc")
    # One log line for each problem over three runs, and no traceback.
    (nvml_line,) = [log for log in report["logs"] if "nvidia-ml-py" in log["message"]]
    (grpc_line,) = [log for log in report["logs"] if "grpcio" in log["message"]]
    assert len(report["logs"]) == 2
    assert not nvml_line["traceback"] and not grpc_line["traceback"]
    assert report["imported"] == []


# --- broken wheels ---------------------------------------------------------------------------


def _rewrite_wheel(source, directory, drop=None, prepend=None):
    """A copy of `source` without the members under `drop`, or with text put before members' text."""
    target = directory / "broken" / source.name
    target.parent.mkdir()
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for item in original.infolist():
            if drop and item.filename.startswith(drop):
                continue
            data = original.read(item)
            if prepend and item.filename in prepend:
                data = prepend[item.filename].encode() + data
            copy.writestr(item, data)
    return target



def test_the_readme_gives_the_pinned_local_mode_packages():
    readme = (agent.ROOT / "README.md").read_text()
    for requirement in __about__.DEPS.values():
        assert f"'{requirement}'" in readme
    assert f"datadog_gpu_monitoring-{__about__.__version__}-py3-none-any.whl" in readme


def test_the_sidecar_without_nvml_bindings_says_what_to_install(installed, tmp_path):
    # The Agent's Python has the wheel but not its `deps` extra: the sidecar needs that extra.
    result = subprocess.run(
        [str(agent.python(installed.root)), "-m", "gpu_monitoring.cli", "sidecar", "--socket",
         str(tmp_path / "sidecar.sock"), "--journal", str(tmp_path / "journal")],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "nvidia-ml-py is not installed" in result.stderr and "datadog-gpu-monitoring[deps]" in result.stderr
    assert "Traceback" not in result.stderr
