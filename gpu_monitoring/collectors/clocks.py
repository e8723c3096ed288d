"""Clock speeds, the performance state, and why clocks are held down."""

from ..nvml.device import CLOCK_EVENT_REASONS as REASONS
from ..nvml.device import Device
from ..nvml.queries import CLOCK_TYPES, MAX_CLOCKS
from .base import Collector, Fields, put

NOT_THROTTLING = REASONS["gpu_idle"] | REASONS["applications_clocks_setting"]
THROTTLING = sum(REASONS.values()) & ~NOT_THROTTLING
CLOCK_METRICS = {kind: f"clock.{kind}" for kind in CLOCK_TYPES}
MAX_CLOCK_METRICS = {kind: f"clock.{kind}.max" for kind in MAX_CLOCKS}
REASON_METRICS = {f"clocks_event.{name}": bit for name, bit in REASONS.items()}


class Clocks(Collector):
    name = "clocks"

    def collect(self, device: Device, fields: Fields, out) -> None:
        m = out.metrics
        for kind, metric in CLOCK_METRICS.items():
            if self.wants(metric):
                put(m, metric, device.clock_mhz(kind))
        for kind, value in device.max_clocks_mhz.items():
            put(m, MAX_CLOCK_METRICS[kind], value)
        if self.wants("performance_state"):
            put(m, "performance_state", device.performance_state())
        reasons = device.clock_event_reasons()
        if reasons is None:
            return
        for metric, bit in REASON_METRICS.items():
            m[metric] = 1 if reasons & bit else 0
        m["throttled"] = 1 if reasons & THROTTLING else 0
