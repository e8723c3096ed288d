"""Clock speeds, the performance state, and why clocks are held down."""

from ..nvml import CannotAnswer, Device
from .base import Collector, Fields, read

# NVML clock-event reason bits (nvmlClocksEventReason*).
REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}
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
