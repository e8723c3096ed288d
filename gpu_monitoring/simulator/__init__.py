"""A simulated NVML driver beneath the unmodified pynvml bindings (see `library`)."""

from .clock import SimClock
from .library import SimulatedNvml
from .scenario import Scenario, ScenarioError, available, load

__all__ = ["SimClock", "SimulatedNvml", "Scenario", "ScenarioError", "available", "load"]
