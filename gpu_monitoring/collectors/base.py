"""What every collector shares: the interface and counter rates."""

from typing import Dict, Hashable, Iterable, List, Optional, Tuple

from gpu_monitoring.collectors.series import Series, SeriesValue
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.nvml import FieldKey, NvmlDevice
from gpu_monitoring.nvml import Values as Fields


class Collector:
    """Reads one capability of a device: returns readings of the series it declares (collectors.series)
    and never submits anything. A read that gives only series the metrics profile does not send is
    not made; a sidecar, serving every profile, reads all."""

    name = ""

    def __init__(self, profile: Profile = EVERYTHING) -> None:
        self.profile = profile

    def wants(self, series: Series) -> bool:
        """Whether a read that gives this series is worth its NVML call."""
        return series.name in (self.profile.sent_parts if series.tags else self.profile.sent)

    def fields(self, device: NvmlDevice, links: int) -> Iterable[FieldKey]:
        """Readings (nvml.readings) this collector wants of a device with this many NVLink links:
        one batched call, fallbacks where refused."""
        return ()

    def begin_run(self) -> None:
        """A run of the node begins: what was kept for the last one (faults seen, samples asked) ends."""

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        raise NotImplementedError

    def forget(self) -> None:
        """Drop per-device state (samples, previous counters) when the NVML session restarts."""


def sample_key(device: NvmlDevice) -> Tuple[int, Optional[int]]:
    """Who a sampling history belongs to: the physical GPU and, for a MIG device, its GPU instance."""
    physical = device.parent or device
    return physical.index, device.gpu_instance_id if device.is_mig else None


def from_fields(fields: Fields, series: Dict[FieldKey, Series]) -> List[SeriesValue]:
    """The series of the fields that answered."""
    return [(s, fields[key]) for key, s in series.items() if key in fields]


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
