"""`gpu-monitoring check`: run the check as `datadog-agent check` does and print what it sends."""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from .sidecar import command as sidecar_command
from .summary import summary_lines

STATUS_NAMES = {0: "OK", 1: "WARNING", 2: "CRITICAL", 3: "UNKNOWN"}
DEFAULT_INTERVAL = 15


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-monitoring", description="NVIDIA GPU monitoring for Datadog")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="run the check and print metrics, service checks and events")
    check.add_argument("--config", help="a conf.yaml (init_config + instances); default: one local instance")
    check.add_argument("--simulate", metavar="SCENARIO", help="read a simulated node (name or YAML path)")
    check.add_argument("--runs", type=int, default=2, help="check runs; the last one is printed (default 2)")
    check.add_argument("--json", action="store_true", help="print the last run as JSON")
    metadata = commands.add_parser("metadata", help="print metadata.csv as generated from the metric spec")
    metadata.add_argument("--write", metavar="PATH", help="write it to PATH instead of standard output")
    sidecar_command.add_parsers(commands)
    args = parser.parse_args(argv)
    if args.command == "metadata":
        return write_metadata(args.write)
    if args.command == "sidecar":
        return sidecar_command.run_sidecar(args)
    if args.command == "healthz":
        return sidecar_command.run_healthz(args)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return _run_check_or_explain(args)


class ConfigFileError(Exception):
    """The --config file cannot be read as init_config and a list of instances."""


def _run_check_or_explain(args: argparse.Namespace) -> int:
    """A configuration the check refuses is one line on stderr and exit status 2, as a usage error."""
    from datadog_checks.base import ConfigurationError

    try:
        return run_check(args)
    except (ConfigFileError, ConfigurationError) as e:
        reason = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
        sys.stderr.write(f"gpu-monitoring check: {reason}\n")
        return 2


def write_metadata(path: Optional[str]) -> int:
    from .metric_spec import metadata_csv

    if path:
        Path(path).write_text(metadata_csv())
    else:
        sys.stdout.write(metadata_csv())
    return 0


def run_check(args: argparse.Namespace) -> int:
    from datadog_checks.base.stubs import aggregator

    from .check import GpuMonitoringCheck

    init_config, instances = _instances(args)
    failed = False
    for instance in instances:
        check = GpuMonitoringCheck("gpu_monitoring", init_config, [instance])
        interval = instance.get("min_collection_interval") or DEFAULT_INTERVAL
        previous: Dict[Tuple, float] = {}
        for run in range(args.runs):
            if run:
                _wait(check, interval)
            previous = _counter_values(aggregator) if run else {}
            aggregator.reset()
            error = check.run()
            failed |= bool(error)
            if error:
                sys.stderr.write(_error_text(error))
        check.cancel()
        report = _report(aggregator, previous)
        print(json.dumps(report, indent=2) if args.json else _table(report))
    return 1 if failed else 0


def _instances(args: argparse.Namespace) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    init_config, instances = _read_config(args.config) if args.config else ({}, [{}])
    if args.simulate:
        instances = [dict(instance, simulate=args.simulate) for instance in instances]
    return init_config, instances


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
    init_config, instances = raw.get("init_config") or {}, raw.get("instances") or [{}]
    if not isinstance(init_config, dict):
        raise ConfigFileError(f"`init_config` in {path} must be a mapping; got {init_config!r}")
    if not isinstance(instances, list):
        raise ConfigFileError(f"`instances` in {path} must be a list of mappings; got {instances!r}")
    for index, instance in enumerate(instances):
        if not isinstance(instance, dict):
            raise ConfigFileError(f"`instances` item {index} in {path} must be a mapping of options "
                                  f"(`{{}}` for the defaults); got {instance!r}")
    return init_config, instances


def _wait(check, interval: float) -> None:
    """A simulated node skips ahead one collection interval; a real one waits a second."""
    if check.simulation is not None:
        check.simulation.advance(interval)
    else:
        time.sleep(1)


def _counter_values(aggregator) -> Dict[Tuple, float]:
    values = {}
    for name in aggregator.metric_names:
        for stub in aggregator.metrics(name):
            if stub.type == aggregator.MONOTONIC_COUNT:
                values[(name, tuple(stub.tags))] = stub.value
    return values


def _report(aggregator, previous: Dict[Tuple, float]) -> Dict[str, list]:
    """The last run; monotonic counts show the increase since the run before, as the Agent sends."""
    metrics = []
    type_names = {v: k for k, v in vars(type(aggregator)).items() if k.isupper() and isinstance(v, int)}
    for name in sorted(aggregator.metric_names):
        for stub in aggregator.metrics(name):
            kind = type_names.get(stub.type, str(stub.type)).lower()
            value = stub.value
            if stub.type == aggregator.MONOTONIC_COUNT:
                before = previous.get((name, tuple(stub.tags)))
                if before is None or value < before:
                    continue
                value -= before
            metrics.append({"name": name, "type": kind, "value": value, "tags": sorted(stub.tags)})
    service_checks = [
        {"name": name, "status": STATUS_NAMES[sc.status], "tags": sorted(sc.tags), "message": sc.message or ""}
        for name in sorted(aggregator._service_checks)
        for sc in aggregator.service_checks(name)
    ]
    events = [
        {"title": e["msg_title"], "text": e["msg_text"], "alert_type": e.get("alert_type", "info"),
         "tags": sorted(e.get("tags") or [])}
        for e in aggregator.events
    ]
    return {"metrics": metrics, "service_checks": service_checks, "events": events}


def _short_tags(tags: List[str]) -> str:
    keep = ("gpu_index:", "gpu_instance_id:", "gpu_mig_profile:", "gpu_slicing_mode:", "gpu_sharing_mode:", "xid:",
            "kube_namespace:", "pod_name:", "pid:", "process_name:")
    # A mode is worth a column only where a GPU is sliced or shared.
    return ",".join(t for t in tags if t.startswith(keep) and not t.endswith("_mode:none"))


def _table(report: Dict[str, list]) -> str:
    lines = [f"=== Metrics ({len(report['metrics'])}) ==="]
    lines += [
        f"{m['name']:<58} {m['type']:<16} {m['value']:>18.6g}  {_short_tags(m['tags'])}" for m in report["metrics"]
    ]
    lines.append(f"\n=== Service checks ({len(report['service_checks'])}) ===")
    lines += [
        f"{s['name']:<40} {s['status']:<9} {_short_tags(s['tags']):<40} {s['message']}"
        for s in report["service_checks"]
    ]
    lines.append(f"\n=== Events ({len(report['events'])}) ===")
    lines += [f"[{e['alert_type']}] {e['title']}\n    {e['text'].splitlines()[-1]}" for e in report["events"]]
    # Last, where a terminal leaves it in view: the GPUs, the node's cost and the workloads'.
    lines += ["", *summary_lines(report)]
    return "\n".join(lines)


def _error_text(error: str) -> str:
    try:
        return "".join(f"check error: {item['message']}\n" for item in json.loads(error))
    except (ValueError, KeyError, TypeError):
        return f"check error: {error}\n"


if __name__ == "__main__":
    sys.exit(main())
