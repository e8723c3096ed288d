"""Framebuffer and BAR1 memory."""

from ..nvml.device import Device
from ..nvml.errors import CannotAnswer
from .base import Collector, Fields


class Memory(Collector):
    name = "memory"

    def collect(self, device: Device, fields: Fields, out) -> None:
        try:
            info = device.memory_info()
        except CannotAnswer:
            info = {}
        for key, value in info.items():
            if value is not None:
                out.metrics[f"memory.{key}"] = value
        try:
            out.metrics["memory.bar1.total"], out.metrics["memory.bar1.used"] = device.bar1_memory_info()
        except CannotAnswer:
            pass
