"""A simulated NVML driver beneath the unmodified pynvml bindings (see `library`)."""

from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import Scenario, ScenarioError, available, load

__all__ = ["SimClock", "SimulatedNvml", "Scenario", "ScenarioError", "available", "load"]
