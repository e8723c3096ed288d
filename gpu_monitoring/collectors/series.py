"""What collectors produce: readings of series they declare, each declaration checked against
metrics.yaml (or the snapshot's fields) when the collector's module is imported, so a misspelt or
unlisted metric fails every test rather than being dropped at submission."""

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Tuple, Union

from gpu_monitoring.metrics.spec import SPEC
from gpu_monitoring.snapshot import Device, MigInstance


class Kind(Enum):
    GAUGE = "gauge"
    MONOTONIC_COUNT = "monotonic_count"
    # Not a metric: a fact of the GPU or MIG instance (its processes, its MIG instances, its links
    # that are down) that health and attribution read from the snapshot.
    FACT = "fact"


@dataclass(frozen=True)
class Series:
    name: str
    kind: Kind
    # A series of part of the target (one NVLink link): beside the target's own series of the same
    # name, under these tags.
    tags: Tuple[str, ...] = ()
    # Worked out once: a metric of the target itself, the most common reading, is one flag for
    # `store` to test; a part's series go under its tags joined, the snapshot's key for the part.
    plain: bool = field(init=False, repr=False, compare=False)
    part: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plain", self.kind is not Kind.FACT and not self.tags)
        object.__setattr__(self, "part", ",".join(self.tags))


SeriesValue = Tuple[Series, Any]
"""A series and its value this run; None where the device gave none."""

_FACTS = frozenset(f.name for f in dataclasses.fields(Device)) - {"metrics", "tagged_metrics"}


def gauge(name: str, tags: Tuple[str, ...] = ()) -> Series:
    return _metric(name, Kind.GAUGE, tags)


def monotonic_count(name: str, tags: Tuple[str, ...] = ()) -> Series:
    return _metric(name, Kind.MONOTONIC_COUNT, tags)


def fact(name: str) -> Series:
    if name not in _FACTS:
        raise ValueError(f"{name!r} is not a field of a snapshot's device")
    return Series(name, Kind.FACT)


def _metric(name: str, kind: Kind, tags: Tuple[str, ...]) -> Series:
    metric = SPEC.get(name)
    if metric is None:
        raise ValueError(f"metric {name!r} is not in metrics.yaml")
    if metric.type != kind.value:
        raise ValueError(f"metric {name!r} is a {metric.type} in metrics.yaml, not a {kind.value}")
    return Series(name, kind, tags)


def store(readings: Iterable[SeriesValue], target: Union[Device, MigInstance]) -> None:
    """Puts what a collector read into the snapshot's GPU or MIG instance; a value of None is left out."""
    metrics, parts = target.metrics, target.tagged_metrics
    for series, value in readings:
        if value is None:
            continue
        if series.plain:
            metrics[series.name] = value
        elif series.kind is Kind.FACT:
            setattr(target, series.name, value)
        else:
            # Not setdefault: its default dict would be made for every value, a thousand a run in `full`.
            part = parts.get(series.part)
            if part is None:
                part = parts[series.part] = {}
            part[series.name] = value
