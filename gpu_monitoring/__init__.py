from .__about__ import __version__
from .check import GpuMonitoringCheck

__all__ = ["__version__", "GpuMonitoringCheck"]
