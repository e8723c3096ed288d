"""Clock speeds, the performance state, and why clocks are held down: now (the reasons' flags) and
for how much of the interval (the driver's per-reason time counters)."""

from typing import List

from gpu_monitoring.collectors.base import Collector, CounterRates, Fields
from gpu_monitoring.collectors.series import SeriesValue, gauge
from gpu_monitoring.nvml.device import CLOCK_EVENT_REASONS as REASONS
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.queries import CLOCK_TYPES, MAX_CLOCKS
from gpu_monitoring.nvml.readings import CLOCK_EVENT_TIMES

NOT_THROTTLING = REASONS["gpu_idle"] | REASONS["applications_clocks_setting"]
THROTTLING = sum(REASONS.values()) & ~NOT_THROTTLING
CLOCKS = {kind: gauge(f"clock.{kind}") for kind in CLOCK_TYPES}
MAX_CLOCKS_SERIES = {kind: gauge(f"clock.{kind}.max") for kind in MAX_CLOCKS}
PERFORMANCE_STATE = gauge("performance_state")
REASON_SERIES = [(gauge(f"clocks_event.{name}"), bit) for name, bit in REASONS.items()]
THROTTLED = gauge("throttled")
# Each timed reason's counter (nanoseconds) and its share of the interval, under the flag's name.
TIME_PERCENT = {
    (f"clocks_event_ns_{reason}", 0): gauge("clocks_event.time_percent", (f"throttle_reason:{reason}",))
    for reason in CLOCK_EVENT_TIMES
}
NS_PER_S_TO_PERCENT = 100 / 1e9


class Clocks(Collector):
    name = "clocks"

    def __init__(self) -> None:
        self._rates = CounterRates()

    def fields(self, device: NvmlDevice, links: int):
        return [key for key, series in TIME_PERCENT.items() if self.wants(series)]

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        found = [(series, device.clock_mhz(kind)) for kind, series in CLOCKS.items() if self.wants(series)]
        found += [(MAX_CLOCKS_SERIES[kind], value) for kind, value in device.max_clocks_mhz.items()]
        if self.wants(PERFORMANCE_STATE):
            found.append((PERFORMANCE_STATE, device.performance_state()))
        reasons = device.clock_event_reasons()
        if reasons is not None:
            found += [(series, 1 if reasons & bit else 0) for series, bit in REASON_SERIES]
            found.append((THROTTLED, 1 if reasons & THROTTLING else 0))
        return found + self._time_percent(device, fields)

    def _time_percent(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        """The share of the interval since the last run each reason held the clocks down: its counter's
        growth over the time between NVML's reads. A counter read first, or gone backwards, gives none.
        Capped at the whole interval: the counters and the newest timestamp are not read at one instant."""
        found = []
        for key, series in TIME_PERCENT.items():
            if key not in fields:
                continue
            rate = self._rates.update((device.index, key), fields.timestamp_us, (fields[key],))
            if rate is not None:
                found.append((series, min(100.0, rate[0] * NS_PER_S_TO_PERCENT)))
        return found

    def forget(self) -> None:
        self._rates.forget()
