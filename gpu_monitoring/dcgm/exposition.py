"""What a dcgm-exporter `/metrics` page says of DCGM's profiling fields, per GPU and per MIG instance.

Only the lines of the fields used are kept, then parsed by prometheus_client's parser (which the
Agent ships with datadog-checks-base): a full page holds some thirty fields a GPU, of which a check
run needs a handful. dcgm-exporter names a series by its DCGM field (`DCGM_FI_PROF_SM_ACTIVE`), or
in lower case with `--use-old-namespace` (`dcgm_fi_prof_sm_active`, its GPU in a `uuid` label
rather than `UUID`); a MIG instance's series carry its parent's UUID and `GPU_I_ID`.
"""

import math
from dataclasses import dataclass
from typing import Collection, Dict, List, Optional, Tuple

from prometheus_client.parser import text_string_to_metric_families

from gpu_monitoring.metrics.names import (
    DRAM_ACTIVE,
    FP16_ACTIVE,
    FP32_ACTIVE,
    FP64_ACTIVE,
    GRAPHICS_ACTIVE,
    NVLINK_THROUGHPUT_RX,
    NVLINK_THROUGHPUT_TX,
    PCIE_THROUGHPUT_RX,
    PCIE_THROUGHPUT_TX,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
)

# DCGM's ratios (0-1) are sent as percent, as GPM's are; its PCIe and NVLink fields are bytes per second.
PERCENT = 100.0
FIELDS: Dict[str, Tuple[str, float]] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (GRAPHICS_ACTIVE, PERCENT),
    "DCGM_FI_PROF_SM_ACTIVE": (SM_ACTIVE, PERCENT),
    "DCGM_FI_PROF_SM_OCCUPANCY": (SM_OCCUPANCY, PERCENT),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (TENSOR_ACTIVE, PERCENT),
    "DCGM_FI_PROF_DRAM_ACTIVE": (DRAM_ACTIVE, PERCENT),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": (FP64_ACTIVE, PERCENT),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": (FP32_ACTIVE, PERCENT),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": (FP16_ACTIVE, PERCENT),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (PCIE_THROUGHPUT_TX, 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (PCIE_THROUGHPUT_RX, 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": (NVLINK_THROUGHPUT_TX, 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": (NVLINK_THROUGHPUT_RX, 1.0),
}
# Fields that move at every one of DCGM's samples while a GPU is powered, idle or not: a page whose
# lines of them stand still is a page DCGM no longer updates (freshness.py). The energy counter
# only grows; power draw wanders by milliwatts. Both are in dcgm-exporter's default counters (and,
# in lower case, its old namespace's). Their lines are compared as text, never parsed.
HEARTBEAT = frozenset({"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_POWER_USAGE",
                       "dcgm_total_energy_consumption", "dcgm_power_usage"})
METRICS = frozenset(metric for metric, _ in FIELDS.values())
# A series' name as the page spells it (either namespace) -> its DCGM field.
_NAMES = {**{name: name for name in FIELDS}, **{name.lower(): name for name in FIELDS}}
# Any dcgm-exporter page names DCGM's fields; a page with none is not one.
_DCGM_MARKS = ("DCGM_FI_", "dcgm_")


class NotAnExporterPage(ValueError):
    """The answer is not dcgm-exporter's text format."""


@dataclass(frozen=True)
class Sample:
    """One profiling value, converted: `gpu_uuid` as dcgm_key() makes it, `gpu_instance_id` for a
    MIG instance's, `timestamp` (seconds) where the exporter wrote one."""

    gpu_uuid: str
    gpu_instance_id: Optional[int]
    metric: str
    value: float
    timestamp: Optional[float] = None


@dataclass(frozen=True)
class Page:
    samples: List[Sample]
    # The heartbeat fields' lines in page order, to tell a page DCGM updates from one that repeats.
    heartbeat: Tuple[str, ...] = ()


def dcgm_key(uuid: str) -> str:
    """A GPU's UUID as joins compare it: DCGM and NVML agree on the hex digits, not always on the
    case or the `GPU-` prefix."""
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


# A series' identity (everything but its value: name and labels) -> what it is a value of, None
# for a series left out (no GPU UUID, a GPU_I_ID that is no number). Kept between reads by the
# reader: a page repeats the same series every time, so each is parsed once, then only its value.
Known = Dict[str, Optional[Tuple[str, Optional[int], str, float]]]


def parse(body: bytes, wanted: Collection[str] = METRICS, known: Optional[Known] = None) -> Page:
    """The values of the `wanted` metrics (exposition's names: `sm_active`...) and the heartbeat of a
    page; NotAnExporterPage when it is no dcgm-exporter page. Parsing is most of a read's cost: a
    metric no GPU lacks need not be parsed, and a series `known` from an earlier page has only its
    value read (`known` is updated to this page's series). A series without a GPU UUID, with a
    GPU_I_ID that is no number, or with a value that is no finite number >= 0 (DCGM's NaN where a
    field is not supported) is left out."""
    text = body.decode("utf-8", "replace")
    if not any(mark in text for mark in _DCGM_MARKS):
        raise NotAnExporterPage("the answer names no DCGM field")
    kept, heartbeat = _lines(text, wanted)
    earlier = {} if known is None else dict(known)
    if known is not None:
        known.clear()
    samples = []
    for line in kept:
        series, _, value = line.rstrip("\n").rpartition(" ")
        if series in earlier:
            sample = _known_sample(earlier[series], value)
        else:
            sample = _parse_line(line, series, known)
        if sample is not None:
            samples.append(sample)
        if known is not None and series in earlier:
            known[series] = earlier[series]
    return Page(samples, tuple(heartbeat))


def _known_sample(identity, value: str) -> Optional[Sample]:
    if identity is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise NotAnExporterPage(f"a value of a DCGM field is no number: {value!r}") from None
    return _sample(*identity, number, None)


def _parse_line(line: str, series: str, known: Optional[Known]) -> Optional[Sample]:
    """A line seen for the first time, through prometheus_client's parser; its identity is kept where
    the line has no timestamp (one with a timestamp is parsed whole every time)."""
    try:
        families = list(text_string_to_metric_families(line))
    except (ValueError, TypeError, IndexError) as e:  # the parser's errors for a malformed line
        raise NotAnExporterPage(f"a line of a DCGM field does not parse: {e}") from None
    raw = families[0].samples[0] if families and families[0].samples else None
    if raw is None:
        return None
    metric, scale = FIELDS[_NAMES[families[0].name]]
    identity = _identity(raw.labels, metric, scale)
    if known is not None and raw.timestamp is None:
        known[series] = identity
    return None if identity is None else _sample(*identity, raw.value, raw.timestamp)


def _identity(labels: Dict[str, str], metric: str, scale: float):
    uuid = labels.get("UUID") or labels.get("uuid")
    instance = labels.get("GPU_I_ID")
    if not uuid or (instance is not None and not instance.isdigit()):
        return None
    return dcgm_key(uuid), None if instance is None else int(instance), metric, scale


def _sample(gpu_uuid: str, instance: Optional[int], metric: str, scale: float, value: float,
            timestamp: Optional[float]) -> Optional[Sample]:
    if not math.isfinite(value) or value < 0:
        return None
    value *= scale
    if scale == PERCENT:
        value = min(value, PERCENT)  # a ratio a hair over 1 is a full pipe, not more
    return Sample(gpu_uuid, instance, metric, value, timestamp)


def _lines(text: str, wanted: Collection[str]) -> Tuple[List[str], List[str]]:
    """The lines of the fields wanted (ending in newlines, for the parser), and the heartbeat's. A
    comment (`# HELP`, `# TYPE`) is neither: the parser needs none of them."""
    kept: List[str] = []
    heartbeat: List[str] = []
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        field = _NAMES.get(name)
        if field is not None:
            if FIELDS[field][0] in wanted:
                kept.append(line + "\n")
        elif name in HEARTBEAT:
            heartbeat.append(line)
    return kept, heartbeat
