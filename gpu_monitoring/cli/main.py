"""The `gpu-monitoring` command line: `check` runs the check as `datadog-agent check` does and prints
what it sends; `status` verifies an install; `metadata`; and the sidecar's `sidecar` and `healthz`."""

import argparse
import functools
import json
import logging
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import yaml

from gpu_monitoring.__about__ import __version__
from gpu_monitoring.cli import report, status
from gpu_monitoring.cli.series_listing import series_lines
from gpu_monitoring.cli.status import CRITICAL_FOUND
from gpu_monitoring.cli.summary import summarize, summary_lines
from gpu_monitoring.cli.wrapping import fit, terminal_width
from gpu_monitoring.sidecar import command as sidecar_command
from gpu_monitoring.sidecar.protocol import DEFAULT_SOCKET

HELP_WIDTH = 78
USAGE_ERROR = 2  # argparse's own, and a configuration the check refuses
# Python ignores SIGPIPE, so a reader that stops early (`| head`) makes the next write to it raise
# BrokenPipeError. As the signal module's docs advise ("Note on SIGPIPE"), standard output then points
# at devnull, so that the flush at exit raises no second one; the exit status is the one a shell gives
# a command that SIGPIPE ended (128 + 13).
CLOSED_PIPE = 128 + signal.SIGPIPE
# grpc's C core logs at INFO (a `chttp2_transport ... GOAWAY` line when a server closes a connection)
# unless GRPC_VERBOSITY (grpc doc/environment_variables.md: DEBUG, INFO, ERROR, NONE) says otherwise;
# it reads the variable when grpc is imported.
GRPC_QUIET = {"GRPC_VERBOSITY": "NONE"}
GRPC_NOTE = "gRPC's own logging is off: set GRPC_VERBOSITY=DEBUG (and GRPC_TRACE) to see it."
CHECK_EXIT = ("exit status: 0 when the last run's service checks are OK or WARNING; 1 when a check run raised an "
              "error; 2 for a usage or configuration error; 3 when a service check of the last run is CRITICAL (a "
              "GPU's device.health, the node's node.health, or a *.can_connect such as nvml.can_connect): a script "
              f"can use it as a node check; {CLOSED_PIPE} when the output's reader closed it early (`| head`).")
STATUS_EXIT = ("exit status: 0 when the install works and no GPU or node is CRITICAL (WARNINGs are printed and "
               "still exit 0); 1 when it does not work: a *.can_connect service check (nvml, sidecar, kubelet, dcgm) "
               "is CRITICAL, a run raised an error or nothing was read; 2 for a usage or configuration error; 3 "
               "when it works and a GPU's device.health or the node's node.health is CRITICAL (with "
               f"--connect-only: 0); {CLOSED_PIPE} when the output's reader closed it early (`| head`).")


def main(argv: Optional[List[str]] = None) -> int:
    for name, value in GRPC_QUIET.items():
        os.environ.setdefault(name, value)
    parser, commands = _parser()
    args = parser.parse_args(argv)
    usage_error = commands[args.command].error
    if args.command == "metadata":
        return _printing(lambda: write_metadata(args.write))
    if args.command == "sidecar":
        return sidecar_command.run_sidecar(args)
    if args.command == "healthz":
        return sidecar_command.run_healthz(args)
    if args.runs is not None and args.runs < 1:
        usage_error("--runs must be at least 1")
    if args.whole_timeline and args.runs is not None:
        usage_error("--whole-timeline and --runs cannot be used together: the timeline sets how many runs")
    if args.source == "local" and args.socket:
        usage_error("--socket is the sidecar's: use it with --source sidecar")
    _label_log_lines()
    return _printing(lambda: _run_or_explain(args))


def _label_log_lines() -> None:
    """What the check logs while the CLI runs it goes to stderr with its level and logger, so that a line such
    as a driver reload's is told apart from the CLI's own output and errors (no effect where logging is
    already set up, as under pytest or inside the Agent)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _printing(command: Callable[[], int]) -> int:
    """A command that prints, quiet when what reads its output stops reading."""
    try:
        code = command()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED_PIPE


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; option help wrapped, but never inside a path or a name."""

    def _split_lines(self, text: str, width: int) -> List[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser. argparse hands what a subcommand does not know back to the top level,
    whose error prints the top level's usage; the subcommand's own usage is what shows its options."""

    def parse_known_args(self, args: Optional[Sequence[str]] = None,
                         namespace: Optional[argparse.Namespace] = None) -> Tuple[argparse.Namespace, List[str]]:
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def _parser() -> Tuple[argparse.ArgumentParser, Dict[str, argparse.ArgumentParser]]:
    """The parser, and each subcommand's, whose error() gives that subcommand's usage."""
    parser = argparse.ArgumentParser(prog="gpu-monitoring", description="NVIDIA GPU monitoring for Datadog",
                                     epilog=GRPC_NOTE, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparser = functools.partial(_CommandParser, formatter_class=_Formatter)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=subparser)
    run_options = _run_options()
    check = commands.add_parser(
        "check", parents=[run_options], help="run the check and print what it sends, as `datadog-agent check`",
        description=_wrap("Run the check as `datadog-agent check` does and print the summary (GPUs, funnel, "
                          "cost, service checks not OK, events), then with --series every series it sends."),
        epilog=_epilog(CHECK_EXIT))
    check.add_argument("--series", action="store_true",
                       help="after the summary, list every metric, service check and event (default: the summary)")
    check.add_argument("--json", action="store_true",
                       help="print as JSON: the summary, the last run's metrics and service_checks, every run's "
                            "events and changes, and the runs (default: text)")
    verify = commands.add_parser(
        "status", parents=[run_options], help="verify an install: the summary, and a failing exit status "
                                              "when NVML, the sidecar or the kubelet cannot be read, or a GPU "
                                              "or the node is CRITICAL",
        description=_wrap("Run the check and print the summary (GPUs, funnel, cost, every service check that is "
                          "not OK with its message, events), then whether this install works and whether what "
                          "it monitors is healthy."),
        epilog=_epilog(STATUS_EXIT))
    verify.add_argument("--connect-only", action="store_true",
                        help="judge only whether the install can read what it monitors: a CRITICAL GPU or node "
                             "is printed and exits 0 (default: it exits 3)")
    metadata = commands.add_parser("metadata", help="print metadata.csv as generated from the metric spec")
    metadata.add_argument("--write", metavar="PATH", help="write it to PATH (default: standard output)")
    sidecar_command.add_parsers(commands)
    return parser, commands.choices


def _run_options() -> argparse.ArgumentParser:
    """What `check` and `status` run: which instances, against what, how many times."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--config", metavar="PATH",
                         help="a conf.yaml (init_config + instances) (default: one instance with every default)")
    options.add_argument("--simulate", metavar="SCENARIO",
                         help="read a simulated node: a scenario below or a YAML path (default: this node's GPUs)")
    options.add_argument("--source", choices=("local", "sidecar"),
                         help="read NVML here (local) or the sidecar's socket (default: the instance's `source`, "
                              "local without --config; sidecar with --socket)")
    options.add_argument("--socket", metavar="PATH",
                         help=f"the sidecar's socket (default: the instance's `sidecar_socket`, {DEFAULT_SOCKET})")
    options.add_argument("--runs", type=int, metavar="N",
                         help=f"check runs, one collection interval apart; the tables show the last, the events "
                              f"and changes every run's (default: {report.DEFAULT_RUNS}, or with --simulate enough "
                              "to reach the scenario's first fault)")
    options.add_argument("--whole-timeline", action="store_true",
                         help="with --simulate and no --runs: run until the scenario's last fault has happened "
                              "and ended; the simulated clock skips ahead one interval a run, so this takes seconds "
                              "(default: until its first fault)")
    return options


def _epilog(exit_status: str) -> str:
    return f"scenarios for --simulate:\n{_scenarios()}\n\n{_wrap(exit_status)}\n{GRPC_NOTE}"


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, width=HELP_WIDTH, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False)


def _scenarios() -> str:
    """The scenarios the package ships, as its scenarios directory holds them."""
    try:
        from gpu_monitoring.simulator.scenario import available
    except ImportError as e:  # the simulator runs beneath pynvml, which sidecar mode does without
        return f"  none here: the simulator needs the package's `deps` extra ({e})"
    return _wrap(", ".join(available()), indent="  ")


class ConfigFileError(Exception):
    """The --config file cannot be read as init_config and a list of instances, or the instances it
    gives cannot be run as the command line asks."""


def _run_or_explain(args: argparse.Namespace) -> int:
    """A configuration the check refuses is one line on stderr and exit status 2, as a usage error."""
    from datadog_checks.base import ConfigurationError

    try:
        return run_status(args) if args.command == "status" else run_check(args)
    except (ConfigFileError, ConfigurationError) as e:
        reason = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
        sys.stderr.write(f"gpu-monitoring {args.command}: {reason}\n")
        return USAGE_ERROR


def write_metadata(path: Optional[str]) -> int:
    from gpu_monitoring.metrics.spec import metadata_csv

    if path:
        Path(path).write_text(metadata_csv())
    else:
        sys.stdout.write(metadata_csv())
    return 0


def run_check(args: argparse.Namespace) -> int:
    init_config, instances = _instances(args)
    failed = critical = False
    documents = []
    for number, instance in enumerate(instances, 1):
        result, errors = report.run(init_config, instance, args.runs, args.whole_timeline)
        _write_errors(errors)
        failed |= bool(errors)
        critical |= status.any_critical(result)
        if args.json:
            documents.append({"summary": summarize(result), **result})
        else:
            _print_instance(number, instances, _text(result, args))
    if args.json:
        # One document for the whole command, so that `json.load` reads what several instances print; a
        # single instance's stays the report itself, as consumers of one instance already read it.
        print(json.dumps(documents[0] if len(documents) == 1 else {"instances": documents}, indent=2))
    return 1 if failed else CRITICAL_FOUND if critical else 0


def run_status(args: argparse.Namespace) -> int:
    init_config, instances = _instances(args)
    worst = status.OK
    for number, instance in enumerate(instances, 1):
        result, errors = report.run(init_config, instance, args.runs, args.whole_timeline)
        _write_errors(errors)
        code, line = status.verdict(result, errors, args.connect_only)
        worst = status.worse(worst, code)
        width = terminal_width()
        _print_instance(number, instances,
                        "\n".join([*summary_lines(result, width), "", *fit(line, width, len("Status: "))]))
    return worst


def _print_instance(number: int, instances: List[Dict[str, Any]], text: str) -> None:
    """One instance's text; of several, under a header naming which, since their summaries look alike."""
    if len(instances) > 1:
        if number > 1:
            print()
        print(_instance_header(number, instances))
    print(text)


def _instance_header(number: int, instances: List[Dict[str, Any]]) -> str:
    instance = instances[number - 1]
    if instance.get("simulate"):
        what = f"simulate {instance['simulate']}"
    elif instance.get("source") == "sidecar":
        what = f"source sidecar {instance.get('sidecar_socket') or DEFAULT_SOCKET}"
    else:
        what = f"source {instance.get('source') or 'local'}"
    return f"=== Instance {number} of {len(instances)}: {what} ==="


def _text(result: report.Report, args: argparse.Namespace) -> str:
    width = terminal_width()
    lines = summary_lines(result, width)
    if args.series:
        lines += ["", *series_lines(result, width)]
    return "\n".join(lines)


def _write_errors(errors: List[str]) -> None:
    sys.stderr.write("".join(f"check error: {error}\n" for error in errors))


def _instances(args: argparse.Namespace) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    init_config, instances = _read_config(args.config) if args.config else ({}, [{}])
    instances = [dict(instance, **_overrides(args)) for instance in instances]
    # An instance's own `simulate` counts as --simulate does; only the instances tell, so this is
    # judged here rather than with the other usage errors.
    if args.whole_timeline and not any(instance.get("simulate") for instance in instances):
        raise ConfigFileError("--whole-timeline needs --simulate: a real node has no timeline to run through")
    return init_config, instances


def _overrides(args: argparse.Namespace) -> Dict[str, Any]:
    """The instance options the command line sets on every instance."""
    options: Dict[str, Any] = {}
    if args.simulate:
        options["simulate"] = args.simulate
    if args.source or args.socket:
        options["source"] = args.source or "sidecar"
    if args.socket:
        options["sidecar_socket"] = args.socket
    return options


def _read_config(path: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """init_config and the instances of a conf.yaml, as the Agent would take them."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigFileError(f"cannot read --config {path}: {e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigFileError(f"--config {path} must be a mapping of init_config and instances; "
                              f"got a {type(raw).__name__}")
    init_config, instances = raw.get("init_config") or {}, raw.get("instances")
    # The Agent runs a check once per instance: a file without any runs nothing, not the defaults.
    if instances is None or instances == []:
        raise ConfigFileError(f"{path} has no instances: the Agent would run none")
    if not isinstance(init_config, dict):
        raise ConfigFileError(f"`init_config` in {path} must be a mapping; got {init_config!r}")
    if not isinstance(instances, list):
        raise ConfigFileError(f"`instances` in {path} must be a list of mappings; got {instances!r}")
    for index, instance in enumerate(instances):
        if not isinstance(instance, dict):
            raise ConfigFileError(f"`instances` item {index} in {path} must be a mapping of options "
                                  f"(`{{}}` for the defaults); got {instance!r}")
    return init_config, instances

