"""Framebuffer and BAR1 memory."""

from typing import List

from ..nvml.device import Device
from .base import Collector, Fields
from .series import Reading, gauge

SERIES = {key: gauge(f"memory.{key}") for key in ("total", "used", "free", "reserved")}
BAR1_TOTAL, BAR1_USED = gauge("memory.bar1.total"), gauge("memory.bar1.used")


class Memory(Collector):
    name = "memory"

    def collect(self, device: Device, fields: Fields) -> List[Reading]:
        found = [(SERIES[key], value) for key, value in device.memory_info().items()]
        bar1 = device.bar1_memory_info() if self.wants(BAR1_TOTAL) or self.wants(BAR1_USED) else None
        if bar1 is not None:
            found += [(BAR1_TOTAL, bar1[0]), (BAR1_USED, bar1[1])]
        return found
