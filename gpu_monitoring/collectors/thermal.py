"""Temperatures, fans, power and energy."""

from typing import List

from gpu_monitoring.collectors.base import Collector, Fields, from_fields
from gpu_monitoring.collectors.series import SeriesValue, gauge, monotonic_count
from gpu_monitoring.nvml.device import NvmlDevice

TEMPERATURE = gauge("temperature")
SLOWDOWN_THRESHOLD = gauge("temperature.slowdown_threshold")
FAN_SPEED = gauge("fan.speed")
FIELDS = {("memory_temperature", 0): gauge("temperature.memory")}
# Readings NVML gives in thousandths (mJ, mW) of what the metrics submit.
THOUSANDTHS = {
    ("energy_mj", 0): monotonic_count("energy.consumed"),
    ("power_mw", 0): gauge("power.usage"),
    ("power_limit_mw", 0): gauge("power.limit"),
}


class Thermal(Collector):
    name = "thermal"

    def fields(self, device: NvmlDevice, links: int):
        return [*FIELDS, *THOUSANDTHS]

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        return [
            (TEMPERATURE, device.temperature()),
            (SLOWDOWN_THRESHOLD, device.slowdown_temperature),
            (FAN_SPEED, device.fan_speed()),
            *from_fields(fields, FIELDS),
            *((series, fields[key] / 1000.0) for key, series in THOUSANDTHS.items() if key in fields),
        ]
