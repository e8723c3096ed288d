"""The fleet funnel (total → allocated → active → effective) and what GPUs and their idle time cost."""

import fnmatch
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from gpu_monitoring.attribution.activity import ACTIVITY_METRICS, UTILIZATION, activity_level
from gpu_monitoring.attribution.capacity import GpuShares, PriceOf, Unusable, shares, unusable
from gpu_monitoring.attribution.claims import Claimed
from gpu_monitoring.attribution.workloads import Workload
from gpu_monitoring.metrics.names import (
    FLEET_DEVICES_ACTIVE,
    FLEET_DEVICES_ALLOCATABLE,
    FLEET_DEVICES_ALLOCATED,
    FLEET_DEVICES_EFFECTIVE,
    FLEET_DEVICES_TOTAL,
    UTILIZATION_GPU,
)
from gpu_monitoring.snapshot import Device, Snapshot

FunnelKey = Tuple[Optional[str], str]  # (GPU model, basis)
# The funnel's stages in order, and the metric that counts each.
STAGES = {
    "total": FLEET_DEVICES_TOTAL,
    "allocatable": FLEET_DEVICES_ALLOCATABLE,
    "allocated": FLEET_DEVICES_ALLOCATED,
    "active": FLEET_DEVICES_ACTIVE,
    "effective": FLEET_DEVICES_EFFECTIVE,
}


@dataclass
class DeviceState:
    allocated: bool
    active: bool
    effective: bool
    basis: str = UTILIZATION  # who measured the activity `effective` rests on: gpm | dcgm | utilization


@dataclass
class Fleet:
    states: Dict[int, DeviceState]
    prices: Dict[int, Optional[float]]  # US$ per hour of each GPU, where configured
    funnel: Dict[FunnelKey, Dict[str, int]]  # counts by (GPU model, activity basis)
    shares: Dict[int, GpuShares]  # what each GPU's workloads hold of it, and what nobody holds
    unusable: List[Unusable]  # GPUs the node has and cannot use


def fleet(
    snapshot: Snapshot, claimed: Claimed, found: List[Workload], effective_threshold: float, price_of: PriceOf,
    expected_gpus: Optional[int] = None,
) -> Fleet:
    devices = snapshot.devices
    states = {d.index: device_state(d, d.index in claimed.allocated, effective_threshold) for d in devices}
    prices = {d.index: price_of(d.name) for d in devices}
    return Fleet(states, prices, funnel(devices, states, claimed.allocatable), shares(devices, found),
                 unusable(snapshot, expected_gpus, price_of))


def busy(device: Device) -> bool:
    """Did the GPU do work during the interval: engine utilization, SM or graphics-engine activity
    (GPM or DCGM, the GPU's or a MIG instance's) or a process's SM use. Where none of these is
    measured (MIG instances nobody profiles), running compute processes."""
    processes = device.processes + [p for i in device.mig_instances for p in i.processes]
    signals = [device.metrics.get(UTILIZATION_GPU)]
    signals += [t.metrics.get(name) for t in (device, *device.mig_instances) for name in ACTIVITY_METRICS]
    signals += [p.sm_utilization for p in processes]
    measured = [s for s in signals if s is not None]
    if measured:
        return any(s > 0 for s in measured)
    return any(p.kind == "compute" for p in processes)


def device_state(device: Device, allocated: bool, threshold: float) -> DeviceState:
    level, basis = activity_level(device)
    active = allocated and busy(device)
    # An idle GPU is not effective at any level.
    return DeviceState(allocated, active, active and level is not None and level >= threshold, basis)


def funnel(
    devices: List[Device], states: Dict[int, DeviceState], offered: Optional[Dict[int, bool]] = None
) -> Dict[FunnelKey, Dict[str, int]]:
    """Counts per GPU model and basis on this node (so that a sum over the basis is the model's);
    a lost GPU still counts in total. `allocatable` (GPUs a device plugin advertises) is counted
    only where the kubelet says which those are."""
    counts: Dict[FunnelKey, Dict[str, int]] = {}
    stages = ["total", "allocated", "active", "effective"]
    if offered is not None:
        stages.insert(1, "allocatable")
    for device in devices:
        state = states.get(device.index)
        basis = state.basis if state is not None else UTILIZATION
        row = counts.setdefault((device.name, basis), dict.fromkeys(stages, 0))
        row["total"] += 1
        if offered is not None:
            row["allocatable"] += offered.get(device.index, False)
        if state is not None:
            row["allocated"] += state.allocated
            row["active"] += state.active
            row["effective"] += state.effective
    return counts


def hourly_price(model: Optional[str], prices: Mapping[str, float], default: Optional[float]) -> Optional[float]:
    """The configured price of a GPU model: an exact name first, then the first glob that matches."""
    if model is None:
        return default
    if model in prices:
        return prices[model]
    for pattern, price in prices.items():
        if fnmatch.fnmatchcase(model, pattern):
            return price
    return default
