"""The metric spec (metrics.yaml): names, types, units; and metadata.csv generated from it."""

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet

import yaml

NAMESPACE = "gpu_monitoring"
SPEC_PATH = Path(__file__).parent / "metrics.yaml"
# Datadog's metadata types for our submission types.
METADATA_TYPES = {"gauge": "gauge", "monotonic_count": "count", "count": "count"}
# The choices of the `metrics_profile` option, smallest first: each sends what the one before it
# sends, and more. A metric's `profile` is the smallest that sends it.
PROFILES = ("essential", "standard", "full")
DEFAULT_PROFILE = "standard"
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
    profile: str
    unit: str = ""
    per_unit: str = ""
    orientation: int = 0
    # The lowest metrics_profile that sends its series of a part of the GPU (one per NVLink link or
    # memory location), where that differs from `profile`, the GPU's own series'; and the tag that
    # names the part. A query of the metric says which it reads: `tag:*` the parts, `!tag:*` the GPU's.
    part_profile: str = ""
    part_tag: str = ""

    @property
    def parts_profile(self) -> str:
        return self.part_profile or self.profile

    @property
    def full_name(self) -> str:
        return f"{NAMESPACE}.{self.name}"


def load() -> Dict[str, Metric]:
    raw = yaml.safe_load(SPEC_PATH.read_text())
    metrics = {name: Metric(name=name, **fields) for name, fields in raw.items()}
    for metric in metrics.values():
        if metric.type not in METADATA_TYPES:
            raise ValueError(f"{metric.name}: unknown type {metric.type!r}")
        if metric.profile not in PROFILES or metric.parts_profile not in PROFILES:
            raise ValueError(f"{metric.name}: unknown profile {metric.profile!r} or {metric.part_profile!r}")
        if bool(metric.part_profile) != bool(metric.part_tag):
            raise ValueError(f"{metric.name}: a part_profile needs its part_tag, and a part_tag its part_profile")
    return metrics


SPEC: Dict[str, Metric] = load()


def sent_in(profile: str, parts: bool = False) -> FrozenSet[str]:
    """The names of the metrics a `metrics_profile` sends for a GPU itself, or with `parts` for its
    parts (series tagged with the part, such as `nvlink_port`)."""
    rank = PROFILES.index(profile)
    return frozenset(name for name, metric in SPEC.items()
                     if PROFILES.index(metric.parts_profile if parts else metric.profile) <= rank)


def _sent_with(profile: str) -> str:
    rank = PROFILES.index(profile)
    if rank == 0:
        return "sent in every metrics_profile"
    return "sent with metrics_profile " + " or ".join(PROFILES[rank:])


def _parts_sent_with(metric: Metric) -> str:
    if not metric.part_profile:
        return ""
    return f"; its series per {metric.part_tag}, {_sent_with(metric.part_profile)}"


def metadata_csv() -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(METADATA_COLUMNS)
    for metric in SPEC.values():
        short = metric.name.replace("_", " ").replace(".", " ")
        writer.writerow([
            metric.full_name, METADATA_TYPES[metric.type], "", metric.unit, metric.per_unit,
            f"{metric.description} ({_sent_with(metric.profile)}{_parts_sent_with(metric)})", metric.orientation,
            NAMESPACE, short, "", "",
        ])
    return out.getvalue()
