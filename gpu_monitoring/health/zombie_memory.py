"""GPU memory held by processes whose owner is gone, on a GPU no workload holds: nobody will free it,
and the next workload given the GPU starts with less memory than it asked for."""

from typing import List

from gpu_monitoring.attribution.idle_reasons import Zombie, describe
from gpu_monitoring.health.device_health import Health
from gpu_monitoring.status import Status


def judge(health: Health, zombies: List[Zombie], held: float) -> None:
    """`held`: the GPU-equivalents workloads hold of the GPU. Where one holds it, its zombies are that
    workload's idle reason instead."""
    if zombies and not held:
        health.add(Status.WARNING, f"no workload holds this GPU, yet processes whose owner is gone hold its "
                                   f"memory: {describe(zombies)}")
