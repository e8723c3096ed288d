"""Temperatures, fans, power and energy."""

from typing import List

from gpu_monitoring.collectors.base import Collector, Fields, from_fields
from gpu_monitoring.collectors.series import SeriesValue, gauge, monotonic_count
from gpu_monitoring.metrics.names import (
    ENERGY_CONSUMED,
    FAN_SPEED,
    POWER_LIMIT,
    POWER_USAGE,
    TEMPERATURE,
    TEMPERATURE_MEMORY,
    TEMPERATURE_SLOWDOWN_THRESHOLD,
)
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.readings import field

GPU_TEMPERATURE = gauge(TEMPERATURE)
SLOWDOWN_THRESHOLD = gauge(TEMPERATURE_SLOWDOWN_THRESHOLD)
FAN = gauge(FAN_SPEED)
FIELDS = {field("memory_temperature"): gauge(TEMPERATURE_MEMORY)}
# Readings NVML gives in thousandths (mJ, mW) of what the metrics submit.
THOUSANDTHS = {
    field("energy_mj"): monotonic_count(ENERGY_CONSUMED),
    field("power_mw"): gauge(POWER_USAGE),
    field("power_limit_mw"): gauge(POWER_LIMIT),
}


class Thermal(Collector):
    name = "thermal"

    def fields(self, device: NvmlDevice, links: int):
        return [*FIELDS, *THOUSANDTHS]

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        return [
            (GPU_TEMPERATURE, device.temperature()),
            (SLOWDOWN_THRESHOLD, device.slowdown_temperature),
            (FAN, device.fan_speed()),
            *from_fields(fields, FIELDS),
            *((series, fields[key] / 1000.0) for key, series in THOUSANDTHS.items() if key in fields),
        ]
