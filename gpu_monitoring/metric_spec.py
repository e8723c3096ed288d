"""The metric spec (metrics.yaml): names, types, units; and metadata.csv generated from it."""

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Dict

import yaml

NAMESPACE = "gpu_monitoring"
SPEC_PATH = Path(__file__).parent / "metrics.yaml"
# Datadog's metadata types for our submission types.
METADATA_TYPES = {"gauge": "gauge", "monotonic_count": "count", "count": "count"}
METADATA_COLUMNS = [
    "metric_name", "metric_type", "interval", "unit_name", "per_unit_name", "description",
    "orientation", "integration", "short_name", "curated_metric", "sample_tags",
]


@dataclass(frozen=True)
class Metric:
    name: str
    type: str
    scope: str
    description: str
    unit: str = ""
    per_unit: str = ""
    orientation: int = 0

    @property
    def full_name(self) -> str:
        return f"{NAMESPACE}.{self.name}"


def load() -> Dict[str, Metric]:
    raw = yaml.safe_load(SPEC_PATH.read_text())
    metrics = {name: Metric(name=name, **fields) for name, fields in raw.items()}
    for metric in metrics.values():
        if metric.type not in METADATA_TYPES:
            raise ValueError(f"{metric.name}: unknown type {metric.type!r}")
    return metrics


SPEC: Dict[str, Metric] = load()


def metadata_csv() -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(METADATA_COLUMNS)
    for metric in SPEC.values():
        short = metric.name.replace("_", " ").replace(".", " ")
        writer.writerow([
            metric.full_name, METADATA_TYPES[metric.type], "", metric.unit, metric.per_unit,
            metric.description, metric.orientation, NAMESPACE, short, "", "",
        ])
    return out.getvalue()
