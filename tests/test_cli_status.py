"""`gpu-monitoring status` verifies an install: it prints the summary and every service check that is
not OK, and exits 1 when NVML, the sidecar or the kubelet cannot be connected to (a `*.can_connect`
service check CRITICAL), 0 otherwise, 2 for a usage or configuration error."""

import ctypes.util

import pytest
import yaml

from gpu_monitoring.cli.main import main

from .sidecar_support import SidecarProcess

NOT_WORKING = 1


def status(capsys, *args):
    code = main(["status", *args])
    return code, capsys.readouterr().out


def verdict(out):
    return out.rstrip().splitlines()[-1]


def test_a_simulated_node_works(capsys):
    code, out = status(capsys, "--simulate", "dgx-h100")
    assert code == 0
    assert out.startswith("=== GPUs (8) ===") and "=== Workload cost" in out
    assert verdict(out) == "Status: OK"


def test_warnings_print_and_exit_0(capsys):
    code, out = status(capsys, "--simulate", "faults")
    assert code == 0
    assert "device.health          CRITICAL  GPU 2" in out and "WARNING" in out
    assert verdict(out).startswith("Status: OK (")


def test_a_library_that_is_not_there(capsys, tmp_path):
    config = tmp_path / "conf.yaml"
    missing = tmp_path / "libnvidia-ml.so.1"
    config.write_text(yaml.safe_dump({"instances": [{"nvml_library_path": str(missing), "kubernetes": False}]}))
    code, out = status(capsys, "--config", str(config))
    assert code == NOT_WORKING
    assert "nvml.can_connect       CRITICAL  node" in out
    assert verdict(out).startswith("Status: NOT WORKING: gpu_monitoring.nvml.can_connect is CRITICAL: ")
    assert str(missing) in verdict(out)


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver")
def test_a_node_without_a_driver(capsys):
    code, out = status(capsys)
    assert code == NOT_WORKING
    assert "libnvidia-ml.so.1" in verdict(out) and "nvml.can_connect is CRITICAL" in verdict(out)


def test_a_sidecar_that_is_down(capsys, tmp_path):
    socket = tmp_path / "sidecar.sock"
    code, out = status(capsys, "--source", "sidecar", "--socket", str(socket))
    assert code == NOT_WORKING
    assert "sidecar.can_connect    CRITICAL  node" in out
    assert verdict(out).startswith("Status: NOT WORKING: gpu_monitoring.sidecar.can_connect is CRITICAL: ")
    assert str(socket) in verdict(out)


def test_a_sidecar_that_answers(capsys, tmp_path):
    sidecar = SidecarProcess(tmp_path, "legacy-driver").start()
    try:
        code, out = status(capsys, "--socket", sidecar.socket)
    finally:
        sidecar.stop()
    assert code == 0, out
    assert verdict(out) == "Status: OK"


def test_a_configuration_refused_is_a_usage_error(capsys):
    assert main(["status", "--simulate", "no-such-scenario"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-monitoring status: ") and "`simulate`" in err
