"""What `gpu-monitoring check` and `status` refuse rather than quietly run something else: an option
that cannot apply, an option a subcommand does not know (answered with that subcommand's usage), and a
--config file that gives the Agent nothing to run. And what the check logs meanwhile is labelled."""

import subprocess
import sys

import pytest

from gpu_monitoring.cli.main import USAGE_ERROR, main

COMMANDS = ["check", "status"]


def refused(capsys, args):
    """The usage error argparse raises for `args`: its exit status and its stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    captured = capsys.readouterr()
    assert captured.out == ""
    return exit_.value.code, captured.err


@pytest.mark.parametrize("command", COMMANDS)
def test_whole_timeline_without_simulate_is_refused(capsys, command):
    assert main([command, "--whole-timeline"]) == USAGE_ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"gpu-monitoring {command}: --whole-timeline needs --simulate: "
                            "a real node has no timeline to run through\n")


def test_whole_timeline_with_a_config_that_simulates_runs(capsys, tmp_path):
    # A simulated node named in the config is as good as --simulate: its timeline is there to run through.
    config = tmp_path / "conf.yaml"
    config.write_text("instances:\n  - {simulate: t4-shared}\n")
    assert main(["check", "--config", str(config), "--whole-timeline"]) == 0
    assert "=== GPUs" in capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_whole_timeline_with_runs_is_refused(capsys, command):
    code, err = refused(capsys, [command, "--simulate", "faults", "--whole-timeline", "--runs", "3"])
    assert code == USAGE_ERROR
    assert err.startswith(f"usage: gpu-monitoring {command} ")
    assert err.endswith(f"gpu-monitoring {command}: error: --whole-timeline and --runs cannot be used together: "
                        "the timeline sets how many runs\n")


UNKNOWN = {
    "check --bogus": ["check", "--bogus"],
    "status --series": ["status", "--series"],
    "check, a stray word": ["check", "--simulate", "dgx-h100", "stray"],
    "metadata --bogus": ["metadata", "--bogus"],
}


@pytest.mark.parametrize("args", UNKNOWN.values(), ids=UNKNOWN.keys())
def test_an_unknown_option_gives_the_subcommands_usage(capsys, args):
    command, unknown = args[0], args[-1]
    code, err = refused(capsys, args)
    assert code == USAGE_ERROR
    assert err.startswith(f"usage: gpu-monitoring {command} ")
    assert err.endswith(f"gpu-monitoring {command}: error: unrecognized arguments: {unknown}\n")


def test_an_unknown_option_before_the_subcommand_gives_the_top_level_usage(capsys):
    code, err = refused(capsys, ["--bogus", "check"])
    assert code == USAGE_ERROR
    assert err.startswith("usage: gpu-monitoring [-h]")
    assert "gpu-monitoring: error: unrecognized arguments: --bogus\n" in err


@pytest.mark.parametrize("args", [["--runs", "0"], ["--source", "local", "--socket", "/tmp/x.sock"]])
def test_a_usage_error_of_check_gives_checks_usage(capsys, args):
    code, err = refused(capsys, ["check", "--simulate", "dgx-h100", *args])
    assert code == USAGE_ERROR
    assert err.startswith("usage: gpu-monitoring check ")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_still_works(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: gpu-monitoring {command} ")


NO_INSTANCES = {
    "an empty list": "init_config: {}\ninstances: []\n",
    "null": "init_config: {}\ninstances:\n",
    "no instances key": "init_config: {}\n",
    "an empty file": "",
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("content", NO_INSTANCES.values(), ids=NO_INSTANCES.keys())
def test_a_config_without_instances_runs_nothing(capsys, tmp_path, command, content):
    config = tmp_path / "conf.yaml"
    config.write_text(content)
    # --simulate would otherwise make a default instance that runs on any machine.
    assert main([command, "--config", str(config), "--simulate", "dgx-h100"]) == USAGE_ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"gpu-monitoring {command}: {config} has no instances: the Agent would run none\n"


def test_what_the_check_logs_is_labelled_on_stderr():
    """A driver reload's log line, in a run of the faults scenario through the CLI as a user starts it, says its
    level and logger: it is not taken for the CLI's own output."""
    done = subprocess.run([sys.executable, "-m", "gpu_monitoring.cli", "check", "--simulate", "faults",
                           "--whole-timeline"], capture_output=True, text=True, timeout=300)
    lines = done.stderr.splitlines()
    assert any("NVML lost its initialisation" in line for line in lines)
    assert lines and all(line.split(" ", 1)[0] in ("INFO", "WARNING", "ERROR", "CRITICAL") for line in lines), lines
