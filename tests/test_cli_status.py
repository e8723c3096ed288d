"""`gpu-monitoring status` verifies an install: it prints the summary and every service check that is
not OK, and exits 1 when NVML, the sidecar or the kubelet cannot be connected to (a `*.can_connect`
service check CRITICAL), 3 when they can and a GPU or the node is CRITICAL (0 with --connect-only),
0 otherwise, 2 for a usage or configuration error. `check` exits 3 on any CRITICAL service check."""

import ctypes.util
import re

import pytest
import yaml

from gpu_monitoring.cli.main import main

from .sidecar_support import SidecarProcess

NOT_WORKING = 1
CRITICAL_FOUND = 3


def status(capsys, *args):
    code = main(["status", *args])
    return code, capsys.readouterr().out


def verdict(out):
    return out.rstrip().splitlines()[-1]


def test_a_simulated_node_works(capsys):
    code, out = status(capsys, "--simulate", "dgx-h100")
    assert code == 0
    assert out.startswith("=== GPUs (8) ===") and "=== Workload cost" in out
    # Its one warning, the memory a failed pod's process holds on GPU 7, is printed and does not fail it.
    problems = out.split("=== Service checks not OK (1 of 11) ===\n")[1].split("\n\n")[0]
    assert problems.startswith("device.health          WARNING   GPU 7   ") and "pid 90114" in problems, problems
    assert verdict(out) == "Status: OK (1 service check not OK: see above)"


def test_a_gpu_that_is_critical_fails_the_status(capsys):
    # At t=30 GPU 2 is off the bus and GPU 3 has had double-bit ECC errors: NVML itself answers.
    code, out = status(capsys, "--simulate", "faults")
    assert code == CRITICAL_FOUND
    assert "device.health          CRITICAL  GPU 2" in out and "device.health          CRITICAL  GPU 3" in out
    assert verdict(out) == "Status: CRITICAL: the install works, and these are CRITICAL: GPU 2, GPU 3 (see above)"


def test_the_node_that_is_critical_fails_the_status(capsys):
    code, out = status(capsys, "--simulate", "gpu-missing")
    assert code == CRITICAL_FOUND
    assert "node.health            CRITICAL  node" in out
    assert verdict(out).endswith("these are CRITICAL: node (see above)")


def test_connect_only_judges_only_whether_the_install_reads(capsys):
    code, out = status(capsys, "--simulate", "faults", "--connect-only")
    assert code == 0
    assert "device.health          CRITICAL  GPU 2" in out
    assert verdict(out) == "Status: OK (5 service checks not OK: see above)"


def test_warnings_print_and_exit_0(capsys):
    # After the driver reload at t=110 only warnings are left: a remap pending, a slow port, a held flap.
    code, out = status(capsys, "--simulate", "faults", "--whole-timeline")
    assert code == 0
    problems = out.split("=== Service checks not OK")[1].split("\n\n")[0]
    assert "WARNING" in problems and "CRITICAL" not in problems
    assert verdict(out) == "Status: OK (2 service checks not OK: see above)"


@pytest.mark.parametrize("command", ["check", "status"])
def test_help_gives_every_exit_status(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    epilog = " ".join(capsys.readouterr().out.split("exit status:")[1].split())
    for code in (0, 1, 2, 3, 141):
        assert re.search(rf"(^|; ){code} (when|for) ", epilog), (code, epilog)
    assert ("--connect-only" in epilog) == (command == "status")


def test_a_library_that_is_not_there(capsys, tmp_path):
    config = tmp_path / "conf.yaml"
    missing = tmp_path / "libnvidia-ml.so.1"
    config.write_text(yaml.safe_dump({"instances": [{"nvml_library_path": str(missing), "kubernetes": False}]}))
    code, out = status(capsys, "--config", str(config))
    assert code == NOT_WORKING
    assert "nvml.can_connect       CRITICAL  node" in out
    assert verdict(out).startswith("Status: NOT WORKING: gpu_monitoring.nvml.can_connect is CRITICAL: ")
    assert str(missing) in verdict(out)
    # `check` says so too: nvml.can_connect CRITICAL is a CRITICAL service check of its last run.
    assert main(["check", "--config", str(config)]) == CRITICAL_FOUND
    assert "nvml.can_connect       CRITICAL  node" in capsys.readouterr().out


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
