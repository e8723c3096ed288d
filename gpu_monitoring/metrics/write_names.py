"""Writes metrics/names.py, a constant per metric of metrics.yaml: `python -m gpu_monitoring.metrics.write_names`.

Code names a metric by importing its constant, so a misspelt name fails when its module is imported,
in every test, rather than when a run first sends it. tests/test_metric_names.py holds the file to
metrics.yaml."""

import re
from pathlib import Path
from typing import Dict, Iterable

from gpu_monitoring.metrics.spec import SPEC

NAMES_PATH = Path(__file__).parent / "names.py"
HEADER = '''"""Every metric's name, one constant each, generated from metrics.yaml by
`python -m gpu_monitoring.metrics.write_names`: do not edit. Import the constants by name
(`from gpu_monitoring.metrics.names import TEMPERATURE`), so that a misspelt one fails at import."""
'''
_NOT_IN_CONSTANT = re.compile(r"[^A-Z0-9]+")


def constant(metric: str) -> str:
    """`clocks_event.gpu_idle` -> `CLOCKS_EVENT_GPU_IDLE`."""
    return _NOT_IN_CONSTANT.sub("_", metric.upper())


def constants(metrics: Iterable[str]) -> Dict[str, str]:
    """Each metric's constant, by constant; two metrics that would share one are an error."""
    found: Dict[str, str] = {}
    for metric in metrics:
        name = constant(metric)
        if name in found:
            raise ValueError(f"metrics {found[name]!r} and {metric!r} would both be named {name}")
        found[name] = metric
    return found


def source() -> str:
    lines = [f"{name} = \"{metric}\"" for name, metric in constants(SPEC).items()]
    return HEADER + "\n" + "\n".join(lines) + "\n"


def main() -> None:
    NAMES_PATH.write_text(source())


if __name__ == "__main__":
    main()
