"""Clock speeds, the performance state, and why clocks are held down: now (the reasons' flags) and
for how much of the interval (the driver's per-reason time counters)."""

from typing import List

from gpu_monitoring.collectors.base import Collector, CounterRates, Fields
from gpu_monitoring.collectors.series import SeriesValue, gauge
from gpu_monitoring.metrics.names import (
    CLOCK_GRAPHICS,
    CLOCK_MEMORY,
    CLOCK_MEMORY_MAX,
    CLOCK_SM,
    CLOCK_SM_MAX,
    CLOCK_VIDEO,
    CLOCKS_EVENT_APPLICATIONS_CLOCKS_SETTING,
    CLOCKS_EVENT_GPU_IDLE,
    CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN,
    CLOCKS_EVENT_HW_SLOWDOWN,
    CLOCKS_EVENT_HW_THERMAL_SLOWDOWN,
    CLOCKS_EVENT_SW_POWER_CAP,
    CLOCKS_EVENT_SW_THERMAL_SLOWDOWN,
    CLOCKS_EVENT_SYNC_BOOST,
    CLOCKS_EVENT_TIME_PERCENT,
    PERFORMANCE_STATE,
    THROTTLED,
)
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.queries import CLOCK_EVENT_REASONS as REASONS
from gpu_monitoring.nvml.readings import CLOCK_EVENT_TIMES, field

NOT_THROTTLING = REASONS["gpu_idle"] | REASONS["applications_clocks_setting"]
THROTTLING = sum(REASONS.values()) & ~NOT_THROTTLING
# By the clock kinds of NvmlDevice.clock_mhz and max_clocks_mhz.
CLOCKS = {"sm": gauge(CLOCK_SM), "memory": gauge(CLOCK_MEMORY), "graphics": gauge(CLOCK_GRAPHICS),
          "video": gauge(CLOCK_VIDEO)}
MAX_CLOCKS = {"sm": gauge(CLOCK_SM_MAX), "memory": gauge(CLOCK_MEMORY_MAX)}
PSTATE = gauge(PERFORMANCE_STATE)
# Each reason's flag, by its name in CLOCK_EVENT_REASONS.
REASON_METRICS = {
    "gpu_idle": CLOCKS_EVENT_GPU_IDLE,
    "applications_clocks_setting": CLOCKS_EVENT_APPLICATIONS_CLOCKS_SETTING,
    "sw_power_cap": CLOCKS_EVENT_SW_POWER_CAP,
    "hw_slowdown": CLOCKS_EVENT_HW_SLOWDOWN,
    "sync_boost": CLOCKS_EVENT_SYNC_BOOST,
    "sw_thermal_slowdown": CLOCKS_EVENT_SW_THERMAL_SLOWDOWN,
    "hw_thermal_slowdown": CLOCKS_EVENT_HW_THERMAL_SLOWDOWN,
    "hw_power_brake_slowdown": CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN,
}
REASON_SERIES = [(gauge(REASON_METRICS[name]), bit) for name, bit in REASONS.items()]
ANY_THROTTLING = gauge(THROTTLED)
# Each timed reason's counter (nanoseconds) and its share of the interval, under the flag's name.
TIME_PERCENT = {
    field(f"clocks_event_ns_{reason}"): gauge(CLOCKS_EVENT_TIME_PERCENT, (f"throttle_reason:{reason}",))
    for reason in CLOCK_EVENT_TIMES
}
NS_PER_S_TO_PERCENT = 100 / 1e9


class Clocks(Collector):
    name = "clocks"

    def __init__(self, profile: Profile = EVERYTHING) -> None:
        super().__init__(profile)
        self._rates = CounterRates()

    def fields(self, device: NvmlDevice, links: int):
        return [key for key, series in TIME_PERCENT.items() if self.wants(series)]

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        found = [(series, device.clock_mhz(kind)) for kind, series in CLOCKS.items() if self.wants(series)]
        found += [(MAX_CLOCKS[kind], value) for kind, value in device.max_clocks_mhz.items()]
        if self.wants(PSTATE):
            found.append((PSTATE, device.performance_state()))
        reasons = device.clock_event_reasons()
        if reasons is not None:
            found += [(series, 1 if reasons & bit else 0) for series, bit in REASON_SERIES]
            found.append((ANY_THROTTLING, 1 if reasons & THROTTLING else 0))
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
