"""Temperatures, fans, power and energy."""

from ..nvml.device import Device
from .base import Collector, Fields, copy_fields, put

# Readings NVML gives in thousandths (mJ, mW) of what the metrics submit.
THOUSANDTHS = {"energy_mj": "energy.consumed", "power_mw": "power.usage", "power_limit_mw": "power.limit"}


class Thermal(Collector):
    name = "thermal"

    def fields(self, device: Device, links: int):
        return [("memory_temperature", 0), ("energy_mj", 0), ("power_mw", 0), ("power_limit_mw", 0)]

    def collect(self, device: Device, fields: Fields, out) -> None:
        m = out.metrics
        put(m, "temperature", device.temperature())
        put(m, "temperature.slowdown_threshold", device.slowdown_temperature)
        put(m, "fan.speed", device.fan_speed())
        copy_fields(m, fields, {"memory_temperature": "temperature.memory"})
        for key, metric in THOUSANDTHS.items():
            if (key, 0) in fields:
                m[metric] = fields[(key, 0)] / 1000.0
