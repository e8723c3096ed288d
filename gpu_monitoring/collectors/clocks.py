"""Clock speeds, the performance state, and why clocks are held down."""

from ..nvml.device import CLOCK_EVENT_REASONS as REASONS
from ..nvml.device import Device
from ..nvml.errors import CannotAnswer
from .base import Collector, Fields, read

NOT_THROTTLING = REASONS["gpu_idle"] | REASONS["applications_clocks_setting"]


class Clocks(Collector):
    name = "clocks"

    def collect(self, device: Device, fields: Fields, out) -> None:
        m = out.metrics
        for kind in ("sm", "memory", "graphics", "video"):
            read(m, f"clock.{kind}", lambda k=kind: device.clock_mhz(k))
        for kind in ("sm", "memory"):
            read(m, f"clock.{kind}.max", lambda k=kind: device.max_clock_mhz(k))
        read(m, "performance_state", device.performance_state)
        try:
            reasons = device.clock_event_reasons()
        except CannotAnswer:
            return
        for name, bit in REASONS.items():
            m[f"clocks_event.{name}"] = int(bool(reasons & bit))
        m["throttled"] = int(bool(reasons & ~NOT_THROTTLING & sum(REASONS.values())))
