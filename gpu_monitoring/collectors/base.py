"""What every collector shares: the interface, storing a value the device may not give, counter rates."""

from typing import AbstractSet, Dict, Hashable, Iterable, Optional, Tuple

from ..nvml.device import Device
from ..nvml.fields import FieldKey
from ..nvml.fields import Values as Fields


class Collector:
    """Reads one capability of a device into a snapshot entry; never submits anything.

    `out` is a snapshot.Device or snapshot.MigInstance: both have `metrics` and `processes`.
    """

    name = ""
    # Metrics nobody submits nor judges (what the metrics profile leaves out): a read that gives
    # only these is not made. The node collector sets it; a sidecar, serving any profile, reads all.
    unused: AbstractSet[str] = frozenset()

    def wants(self, *metrics: str) -> bool:
        """Whether a read that gives these metrics is worth its NVML call."""
        return not self.unused.issuperset(metrics)

    def fields(self, device: Device, links: int) -> Iterable[FieldKey]:
        """Readings (nvml.readings) this collector wants of a device with this many NVLink links:
        one batched call, fallbacks where refused."""
        return ()

    def collect(self, device: Device, fields: Fields, out) -> None:
        raise NotImplementedError

    def forget(self) -> None:
        """Drop per-device state (samples, previous counters) when the NVML session restarts."""


def sample_key(device: Device) -> Tuple[int, Optional[int]]:
    """Who a sampling history belongs to: the physical GPU and, for a MIG device, its GPU instance."""
    physical = device.parent or device
    return physical.index, device.gpu_instance_id if device.is_mig else None


def put(metrics: Dict[str, float], name: str, value: Optional[float]) -> None:
    """Store value under name unless the device gave none."""
    if value is not None:
        metrics[name] = value


def copy_fields(metrics: Dict[str, float], fields: Fields, names: Dict[str, str]) -> None:
    """Copy device-wide fields (scope 0) that answered into metrics, renamed."""
    for field_name, metric in names.items():
        if (field_name, 0) in fields:
            metrics[metric] = fields[(field_name, 0)]


class CounterRates:
    """Per-second rates of cumulative NVML counters between two runs, one history per key.

    Time comes from NVML's own field timestamps (microseconds), so the interval is the one
    the counters were read over. A counter that went backwards (driver reload) gives no rate.
    """

    def __init__(self) -> None:
        self._previous: Dict[Hashable, Tuple[int, Tuple[float, ...]]] = {}

    def update(self, key: Hashable, timestamp_us: int, values: Tuple[float, ...]) -> Optional[Tuple[float, ...]]:
        previous = self._previous.get(key)
        self._previous[key] = (timestamp_us, values)
        if previous is None or timestamp_us <= previous[0]:
            return None
        if any(now < before for now, before in zip(values, previous[1])):
            return None
        seconds = (timestamp_us - previous[0]) / 1e6
        return tuple((now - before) / seconds for now, before in zip(values, previous[1]))

    def forget(self) -> None:
        self._previous = {}
