"""Clock speeds, the performance state, and why clocks are held down."""

from typing import List

from ..nvml.device import CLOCK_EVENT_REASONS as REASONS
from ..nvml.device import Device
from ..nvml.queries import CLOCK_TYPES, MAX_CLOCKS
from .base import Collector, Fields
from .series import Reading, gauge

NOT_THROTTLING = REASONS["gpu_idle"] | REASONS["applications_clocks_setting"]
THROTTLING = sum(REASONS.values()) & ~NOT_THROTTLING
CLOCKS = {kind: gauge(f"clock.{kind}") for kind in CLOCK_TYPES}
MAX_CLOCKS_SERIES = {kind: gauge(f"clock.{kind}.max") for kind in MAX_CLOCKS}
PERFORMANCE_STATE = gauge("performance_state")
REASON_SERIES = [(gauge(f"clocks_event.{name}"), bit) for name, bit in REASONS.items()]
THROTTLED = gauge("throttled")


class Clocks(Collector):
    name = "clocks"

    def collect(self, device: Device, fields: Fields) -> List[Reading]:
        found = [(series, device.clock_mhz(kind)) for kind, series in CLOCKS.items() if self.wants(series)]
        found += [(MAX_CLOCKS_SERIES[kind], value) for kind, value in device.max_clocks_mhz.items()]
        if self.wants(PERFORMANCE_STATE):
            found.append((PERFORMANCE_STATE, device.performance_state()))
        reasons = device.clock_event_reasons()
        if reasons is not None:
            found += [(series, 1 if reasons & bit else 0) for series, bit in REASON_SERIES]
            found.append((THROTTLED, 1 if reasons & THROTTLING else 0))
        return found
