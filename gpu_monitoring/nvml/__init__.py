"""The only layer that imports pynvml: sessions, devices, GPM samplers and event sets."""

from .device import Device
from .errors import CannotAnswer, GpuLost, LibraryUnavailable, NoNewSamples, NvmlError, NvmlUninitialized
from .events import EventWatcher, RawEvent
from .gpm import GpmSampler
from .session import NvmlSession

__all__ = [
    "CannotAnswer",
    "Device",
    "EventWatcher",
    "GpmSampler",
    "GpuLost",
    "LibraryUnavailable",
    "NoNewSamples",
    "NvmlError",
    "NvmlSession",
    "NvmlUninitialized",
    "RawEvent",
]
