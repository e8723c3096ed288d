"""Framebuffer and BAR1 memory."""

from ..nvml.device import Device
from .base import Collector, Fields, put

METRICS = {key: f"memory.{key}" for key in ("total", "used", "free", "reserved")}
BAR1_METRICS = ("memory.bar1.total", "memory.bar1.used")


class Memory(Collector):
    name = "memory"

    def collect(self, device: Device, fields: Fields, out) -> None:
        for key, value in device.memory_info().items():
            put(out.metrics, METRICS[key], value)
        bar1 = device.bar1_memory_info() if self.wants(*BAR1_METRICS) else None
        if bar1 is not None:
            out.metrics["memory.bar1.total"], out.metrics["memory.bar1.used"] = bar1
