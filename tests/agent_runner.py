"""Runs a check the way the Datadog Agent's Python loader does, in the Python it is started with.

    <agent python> agent_runner.py <conf.d> <check name> <runs>

It imports `datadog_checks.<name>` (then `<name>`), takes the module's AgentCheck subclass that has
no subclasses of its own, reads `<conf.d>/<name>.d/conf.yaml`, runs each instance `runs` times and
prints one JSON document: what the loader found, each run's metrics, service checks and events (from
datadog_checks_base's aggregator stub, which stands in for the Agent's), the log records at WARNING
and above, and whether pynvml or grpc were ever imported. Standard library and the Agent's own
packages only: it runs where nothing else is installed.
"""

import importlib
import json
import logging
import sys
from pathlib import Path

import yaml


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append({
            "logger": record.name,
            "level": record.levelname,
            "message": record.getMessage(),
            "traceback": record.exc_info is not None or "Traceback" in record.getMessage(),
        })


def load(name):
    """The check's module and class, found as the Agent's loader finds them."""
    failures = []
    # The Agent's loader goes on to the next name both when a module does not import and when it
    # holds no check class (datadog-agent pkg/collector/python/loader.go), and reports every failure.
    for module_name in (f"datadog_checks.{name}", name):
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            failures.append(f"{module_name}: {e!r}")
            continue
        found = check_class(module)
        if found is not None:
            return module, found
        failures.append(f"{module_name}: no AgentCheck subclass")
    raise SystemExit("could not load the check: " + "; ".join(failures))


def check_class(module):
    from datadog_checks.base import AgentCheck

    for attribute in dir(module):
        candidate = getattr(module, attribute)
        if (isinstance(candidate, type) and issubclass(candidate, AgentCheck) and candidate is not AgentCheck
                and not candidate.__subclasses__()):
            return candidate
    return None


def collected(aggregator):
    metrics = [
        {"name": stub.name, "type": stub.type, "value": stub.value, "tags": sorted(stub.tags)}
        for stubs in aggregator._metrics.values() for stub in stubs
    ]
    service_checks = [
        {"name": stub.name, "status": stub.status, "message": stub.message, "tags": sorted(stub.tags)}
        for stubs in aggregator._service_checks.values() for stub in stubs
    ]
    return {"metrics": metrics, "service_checks": service_checks, "events": len(aggregator.events)}


def main(confd, name, runs):
    from datadog_checks.base.stubs import aggregator

    records = Records()
    logging.getLogger().addHandler(records)
    module, klass = load(name)
    config = yaml.safe_load((Path(confd) / f"{name}.d" / "conf.yaml").read_text())
    report = {
        "module": module.__name__,
        "module_file": module.__file__,
        "class": f"{klass.__module__}.{klass.__qualname__}",
        "version": getattr(module, "__version__", None),
        "python": sys.version.split()[0],
        "runs": [],
    }
    for instance in config["instances"]:
        check = klass(name, config.get("init_config") or {}, [instance])
        for _ in range(runs):
            aggregator.reset()
            error = check.run()
            report["runs"].append(dict(collected(aggregator), error=json.loads(error) if error else None))
        check.cancel()
    report["logs"] = records.records
    report["imported"] = sorted({m.split(".")[0] for m in sys.modules} & {"pynvml", "grpc"})
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
