"""What every collector shares: the interface and counter rates."""

from typing import Callable, Dict, Generic, Hashable, Iterable, List, Optional, Tuple, TypeVar

from gpu_monitoring.collectors.series import Series, SeriesValue
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.fields import FieldKey
from gpu_monitoring.nvml.fields import Values as Fields


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


T = TypeVar("T")


class Seldom(Generic[T]):
    """Values that change seldom, each read again only once `interval` seconds (of `clock`) have
    passed since its last read, or when the caller says it may have changed. A read that gets no
    answer (a passing failure) keeps the value before it; forget() makes the next read of each ask."""

    def __init__(self, interval: float, clock: Callable[[], float]) -> None:
        self.interval = interval
        self._clock = clock
        self._last: Dict[Hashable, Tuple[float, Optional[T]]] = {}  # when each was asked, its last value

    def get(self, key: Hashable, read: Callable[[], Optional[T]], again: bool = False) -> Optional[T]:
        now = self._clock()
        asked, value = self._last.get(key, (None, None))
        if again or asked is None or now - asked >= self.interval:
            answer = read()
            value = value if answer is None else answer
            self._last[key] = (now, value)
        return value

    def last(self, key: Hashable) -> Optional[T]:
        """The value kept for `key`; None before any answer."""
        return self._last.get(key, (None, None))[1]

    def forget(self) -> None:
        self._last = {}


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
