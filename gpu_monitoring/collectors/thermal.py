"""Temperatures, fans, power and energy."""

from ..nvml.device import Device
from .base import Collector, Fields, copy_fields, read


class Thermal(Collector):
    name = "thermal"

    def fields(self, device: Device):
        return [("memory_temperature", 0), ("energy_mj", 0)]

    def collect(self, device: Device, fields: Fields, out) -> None:
        m = out.metrics
        read(m, "temperature", device.temperature)
        read(m, "temperature.slowdown_threshold", lambda: device.slowdown_temperature)
        read(m, "fan.speed", device.fan_speed)
        read(m, "power.usage", lambda: device.power_usage_mw() / 1000.0)
        read(m, "power.limit", lambda: device.power_limit_mw() / 1000.0)
        copy_fields(m, fields, {"memory_temperature": "temperature.memory"})
        if ("energy_mj", 0) in fields:
            m["energy.consumed"] = fields[("energy_mj", 0)] / 1000.0
