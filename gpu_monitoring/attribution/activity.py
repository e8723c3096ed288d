"""What a GPU's or MIG instance's activity is judged by, and who measured it."""

from typing import Optional, Tuple, Union

from gpu_monitoring.metrics.names import GRAPHICS_ACTIVE, SM_ACTIVE, UTILIZATION_GPU
from gpu_monitoring.snapshot import Device, MigInstance

# What a GPU's activity is judged by, best first: SM activity, then graphics-engine activity (all
# dcgm-exporter's default counters give), from GPM or DCGM; utilization.gpu where neither answers.
ACTIVITY_METRICS = (SM_ACTIVE, GRAPHICS_ACTIVE)
UTILIZATION = "utilization"


def measured_activity(target: Union[Device, MigInstance]) -> Optional[Tuple[float, str]]:
    """A GPU's or MIG instance's own SM activity, else its graphics-engine activity, with who measured
    it; None where neither GPM nor DCGM did."""
    for name in ACTIVITY_METRICS:
        if name in target.metrics:
            # A snapshot from a sidecar older than `activity_source` had these from GPM only.
            return target.metrics[name], target.activity_source or "gpm"
    return None


def activity_level(device: Device) -> Tuple[Optional[float], str]:
    """The activity `effective` compares with the threshold, and its basis: the GPU's SM activity
    (the busiest MIG instance's on a MIG GPU), then its graphics-engine activity, else utilization.gpu."""
    for name in ACTIVITY_METRICS:
        if name in device.metrics:
            return device.metrics[name], device.activity_source or "gpm"
        instances = [measured_activity(i) for i in device.mig_instances if name in i.metrics]
        if instances:
            return max(instances)
    return device.metrics.get(UTILIZATION_GPU), UTILIZATION
