"""The fleet funnel (total → allocated → active → effective) and what GPUs and their idle time cost."""

import fnmatch
from dataclasses import dataclass
from typing import Dict, List, Optional

from ..snapshot import Device


@dataclass
class DeviceState:
    allocated: bool
    active: bool
    effective: bool


def busy(device: Device) -> bool:
    """Did the GPU do work during the interval: engine utilization, GPM SM activity or a process's
    SM use. Where none of these is measured (MIG on GPUs without GPM), running compute processes."""
    processes = device.processes + [p for i in device.mig_instances for p in i.processes]
    signals = [device.metrics.get("utilization.gpu"), device.metrics.get("sm_active")]
    signals += [i.metrics.get("sm_active") for i in device.mig_instances]
    signals += [p.sm_utilization for p in processes]
    measured = [s for s in signals if s is not None]
    if measured:
        return any(s > 0 for s in measured)
    return any(p.kind == "compute" for p in processes)


def activity_level(device: Device) -> Optional[float]:
    """sm_active where GPM answers (the busiest MIG instance on a MIG GPU), else utilization.gpu."""
    m = device.metrics
    if "sm_active" in m:
        return m["sm_active"]
    instances = [i.metrics["sm_active"] for i in device.mig_instances if "sm_active" in i.metrics]
    if instances:
        return max(instances)
    return m.get("utilization.gpu")


def device_state(device: Device, allocated: bool, threshold: float) -> DeviceState:
    active = allocated and busy(device)
    if not active:
        return DeviceState(allocated, active, False)  # an idle GPU is not effective at any level
    level = activity_level(device)
    return DeviceState(allocated, active, level is not None and level >= threshold)


def funnel(
    devices: List[Device], states: Dict[int, DeviceState], offered: Optional[Dict[int, bool]] = None
) -> Dict[Optional[str], Dict[str, int]]:
    """Counts per GPU model on this node; a lost GPU still counts in total. `allocatable` (GPUs a
    device plugin advertises) is counted only where the kubelet says which those are."""
    counts: Dict[Optional[str], Dict[str, int]] = {}
    stages = ["total", "allocated", "active", "effective"]
    if offered is not None:
        stages.insert(1, "allocatable")
    for device in devices:
        row = counts.setdefault(device.name, dict.fromkeys(stages, 0))
        state = states.get(device.index)
        row["total"] += 1
        if offered is not None:
            row["allocatable"] += offered.get(device.index, False)
        if state is not None:
            row["allocated"] += state.allocated
            row["active"] += state.active
            row["effective"] += state.effective
    return counts


def hourly_price(model: Optional[str], prices: Dict[str, float], default: Optional[float]) -> Optional[float]:
    """The configured price of a GPU model: an exact name first, then the first glob that matches."""
    if model is None:
        return default
    if model in prices:
        return prices[model]
    for pattern, price in prices.items():
        if fnmatch.fnmatchcase(model, pattern):
            return price
    return default
