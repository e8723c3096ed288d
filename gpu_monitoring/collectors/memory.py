"""Framebuffer and BAR1 memory."""

from typing import List

from gpu_monitoring.collectors.base import Collector, Fields
from gpu_monitoring.collectors.series import SeriesValue, gauge
from gpu_monitoring.metrics.names import (
    MEMORY_BAR1_TOTAL,
    MEMORY_BAR1_USED,
    MEMORY_FREE,
    MEMORY_RESERVED,
    MEMORY_TOTAL,
    MEMORY_USED,
)
from gpu_monitoring.nvml.device import NvmlDevice

# By the keys of NvmlDevice.memory_info().
SERIES = {"total": gauge(MEMORY_TOTAL), "used": gauge(MEMORY_USED), "free": gauge(MEMORY_FREE),
          "reserved": gauge(MEMORY_RESERVED)}
BAR1_TOTAL, BAR1_USED = gauge(MEMORY_BAR1_TOTAL), gauge(MEMORY_BAR1_USED)


class Memory(Collector):
    name = "memory"

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        found = [(SERIES[key], value) for key, value in device.memory_info().items()]
        bar1 = device.bar1_memory_info() if self.wants(BAR1_TOTAL) or self.wants(BAR1_USED) else None
        if bar1 is not None:
            found += [(BAR1_TOTAL, bar1[0]), (BAR1_USED, bar1[1])]
        return found
