"""The sidecar's command line takes its defaults and its checks from the check's options (spec.yaml and
options.rules): a value the rule refuses is argparse's error naming the flag, never the check's option."""

import argparse
import subprocess
import sys

import pytest

from gpu_monitoring.cli.main import main
from gpu_monitoring.config.proc_root import default_proc_root
from gpu_monitoring.nvml import library
from gpu_monitoring.nvml.errors import LibraryUnavailable
from gpu_monitoring.options.rules import RULES
from gpu_monitoring.options.spec_options import DEFAULTS
from gpu_monitoring.sidecar import command

LONG_SOCKET = "/run/" + "s" * 110 + ".sock"


def refusal(capsys, *argv):
    """argparse's one error line for `gpu-monitoring <argv>`."""
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    return line.split("error: ", 1)[1]


@pytest.mark.parametrize("argv, error", [
    (["sidecar", "--socket", LONG_SOCKET],
     f"argument --socket: must be a unix socket path of at most 107 bytes; got '{LONG_SOCKET}'"),
    (["healthz", "--socket", LONG_SOCKET],
     f"argument --socket: must be a unix socket path of at most 107 bytes; got '{LONG_SOCKET}'"),
    (["sidecar", "--pod-resources-socket", LONG_SOCKET],
     f"argument --pod-resources-socket: must be a unix socket path of at most 107 bytes; got '{LONG_SOCKET}'"),
    (["sidecar", "--dcgm-exporter-url", "auto"],
     "argument --dcgm-exporter-url: must be an http(s) URL such as http://<POD_IP>:9400/metrics; got 'auto'"),
    (["sidecar", "--dcgm-exporter-url", "http://node:99999/metrics"],
     "argument --dcgm-exporter-url: must be an http(s) URL such as http://<POD_IP>:9400/metrics; "
     "got 'http://node:99999/metrics'"),
    (["sidecar", "--pod-cache-ttl", "-1"], "argument --pod-cache-ttl: must be a finite number >= 0; got -1.0"),
    (["sidecar", "--pod-cache-ttl", "nan"], "argument --pod-cache-ttl: must be a finite number >= 0; got nan"),
    (["sidecar", "--pod-cache-ttl", "soon"], "argument --pod-cache-ttl: must be a finite number >= 0; got 'soon'"),
    (["sidecar", "--nvml-library-path", " "], "argument --nvml-library-path: must be a non-empty string; got ' '"),
    (["sidecar", "--proc-root", ""], "argument --proc-root: must be a non-empty string; got ''"),
    (["sidecar", "--kernel-log", "kern.log"],
     "argument --kernel-log: must be auto, none or an absolute path such as /var/log/kern.log; got 'kern.log'"),
    (["sidecar", "--kernel-log", "off"],
     "argument --kernel-log: must be auto, none or an absolute path such as /var/log/kern.log; got 'off'"),
    (["sidecar", "--kernel-log", ""],
     "argument --kernel-log: must be auto, none or an absolute path such as /var/log/kern.log; got ''"),
])
def test_a_bad_flag_is_an_argparse_error_naming_the_flag(capsys, argv, error):
    assert refusal(capsys, *argv) == error


def test_the_sidecars_defaults_are_the_checks():
    commands = argparse.ArgumentParser(prog="gpu-monitoring").add_subparsers()
    command.add_parsers(commands)
    args = commands.choices["sidecar"].parse_args([])
    assert args.socket == DEFAULTS["sidecar_socket"] == "/var/run/gpu-monitoring/sidecar.sock"
    assert args.sysfs_root == DEFAULTS["sysfs_root"] == "/sys"
    assert args.pod_cache_ttl == DEFAULTS["pod_cache_ttl"] == 30
    # Unset: the check's fallback, the host's /proc where it is mounted at /host/proc, else /proc.
    assert args.proc_root is None and default_proc_root() in ("/host/proc", "/proc")
    assert commands.choices["healthz"].parse_args([]).socket == DEFAULTS["sidecar_socket"]
    # Unset, so that a simulated node's own log can stand in; then the check's default.
    assert args.kernel_log is None
    assert command.kernel_log_setting(args.kernel_log) == DEFAULTS["kernel_log"] == "auto"


def sidecar_args(*argv):
    commands = argparse.ArgumentParser(prog="gpu-monitoring").add_subparsers()
    command.add_parsers(commands)
    return commands.choices["sidecar"].parse_args(list(argv))


@pytest.mark.parametrize("value", ["auto", "none", "/dev/kmsg", "/var/log/kern.log", "/host/var/log/kern.log"])
def test_the_kernel_log_flag_takes_what_the_option_takes(value):
    assert sidecar_args("--kernel-log", value).kernel_log == value == RULES["kernel_log"]("kernel_log", value)


def test_a_simulated_node_s_kernel_log_stands_in_unless_the_flag_is_given():
    simulated = {"proc_root": "/tmp/node/proc", "kernel_log": "/tmp/node/kmsg"}
    assert command.kernel_log_setting(sidecar_args("--simulate", "dgx-h100").kernel_log, simulated) == "/tmp/node/kmsg"
    given = sidecar_args("--simulate", "dgx-h100", "--kernel-log", "none").kernel_log
    assert command.kernel_log_setting(given, simulated) == "none"
    # A simulated node that keeps no log reads none: the host's would put real records beside its GPUs.
    assert command.kernel_log_setting(None, {"proc_root": "/tmp/node/proc"}) == "none"


def test_a_library_that_cannot_be_loaded_is_named_by_the_option_that_gave_it(tmp_path):
    missing = str(tmp_path / "libnvidia-ml.so.1")
    for option in ("--nvml-library-path", "nvml_library_path"):
        with pytest.raises(LibraryUnavailable) as error:
            library.load(library.LibraryPath(missing, option))
        assert str(error.value).startswith(f"could not load {option} {missing}: ")


def test_the_sidecars_command_line_needs_neither_pydantic_nor_the_agents_base():
    # The check's models are pydantic's; the sidecar's install has no datadog_checks.base either.
    code = ("import sys; sys.modules['datadog_checks'] = None; "
            "import gpu_monitoring.sidecar.command, gpu_monitoring.sidecar.app; "
            "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'gpu_monitoring.config_models'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
