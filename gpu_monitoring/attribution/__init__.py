"""Attribution: who holds and uses each GPU, how it is shared, the fleet funnel and its cost.

It reads a Snapshot (NVML, processes with their cgroup owners, pod-resources allocations)
and the kubelet's pods, and never calls NVML or submits anything.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from ..kube.pod_list import PodInfo
from ..snapshot import Device, Process, Snapshot
from .fleet import DeviceState, FunnelKey, device_state, funnel, hourly_price
from .holders import Holder, HolderKey, PodDirectory, Tagger
from .targets import TargetResolver, advertised, resolve_all
from .workloads import (
    Claims,
    ProcessHolders,
    TargetKey,
    Targets,
    Workload,
    build_workloads,
    claims_by_target,
    is_mps_server,
    sharing_modes,
    slicing_mode,
    targets_of,
)

ProcessOwners = Dict[Tuple[TargetKey, int], Holder]

__all__ = ["Attribution", "DeviceView", "Holder", "Settings", "Tagger", "Workload", "attribute"]


@dataclass
class Settings:
    effective_threshold: float = 50.0
    hourly_price: Dict[str, float] = field(default_factory=dict)
    default_hourly_price: Optional[float] = None


@dataclass
class DeviceView:
    slicing_mode: str  # none | mig-parent
    state: DeviceState
    price: Optional[float]
    holders: Dict[TargetKey, Holder] = field(default_factory=dict)  # exclusive holder of a GPU or MIG instance
    sharing: Dict[TargetKey, str] = field(default_factory=dict)  # none | time_slicing | mps per target
    offered: Optional[bool] = None  # does a device plugin advertise it; None when the kubelet did not say

    def sharing_mode(self, key: TargetKey) -> str:
        """A MIG parent is no target of its own: nothing shares it."""
        return self.sharing.get(key, "none")


@dataclass
class Attribution:
    devices: Dict[int, DeviceView]
    workloads: List[Workload]
    process_holders: Dict[Tuple[TargetKey, int], Holder]
    funnel: Dict[FunnelKey, Dict[str, int]]  # counts by (GPU model, activity basis)
    allocations_from: str  # pod_resources | processes
    problems: List[str]


def attribute(snapshot: Snapshot, pods: Optional[List[PodInfo]], settings: Settings) -> Attribution:
    directory = PodDirectory(pods)
    from_pod_resources = snapshot.allocations.source == "pod_resources"
    # One resolver for both allocations and advertised IDs: most IDs are in both, resolved once.
    resolver = TargetResolver(snapshot) if from_pod_resources else None
    resolved, problems = resolve_all(resolver, snapshot, snapshot.allocations.items) if resolver else ([], [])
    offer = advertised(resolver, snapshot) if resolver else None
    claims = claims_by_target(resolved, directory, offer.replicas if offer else None)
    held = {key[0] for key, c in claims.items() if c.holders}
    views, workloads, process_holders = {}, [], {}
    for device in snapshot.devices:
        targets = targets_of(device)
        # Each process's owner is looked up once: its own series and its workload both use it.
        holders = [[directory.for_process(p) for p in processes] for _, _, processes in targets]
        owners = _process_holders(targets, holders)
        device_workloads = build_workloads(device, targets, holders, claims, from_pod_resources)
        workloads += device_workloads
        allocated = device.index in held if from_pod_resources else _runs_compute(device)
        views[device.index] = DeviceView(
            slicing_mode=slicing_mode(device),
            state=device_state(device, allocated, settings.effective_threshold),
            price=hourly_price(device.name, settings.hourly_price, settings.default_hourly_price),
            holders=_exclusive_holders(targets, device_workloads, claims, owners),
            sharing=sharing_modes(targets, claims),
            # A GPU whose UUID NVML cannot tell matches no advertised ID: unknown, not refused.
            offered=None if offer is None or not device.uuid else device.index in offer.devices,
        )
        process_holders.update(owners)
    return Attribution(
        devices=views,
        workloads=workloads,
        process_holders=process_holders,
        funnel=funnel(snapshot.devices, {i: v.state for i, v in views.items()}, _offered(views)),
        allocations_from="pod_resources" if from_pod_resources else "processes",
        problems=problems,
    )


def _offered(views: Dict[int, DeviceView]) -> Optional[Dict[int, bool]]:
    if any(view.offered is None for view in views.values()):
        return None
    return {index: bool(view.offered) for index, view in views.items()}


def _runs_compute(device: Device) -> bool:
    processes = device.processes + [p for i in device.mig_instances for p in i.processes]
    return any(p.kind == "compute" for p in processes)


def _exclusive_holders(
    targets: Targets, workloads: List[Workload], claims: Dict[TargetKey, Claims], owners: ProcessOwners
) -> Dict[TargetKey, Holder]:
    """Targets held by exactly one container, not shared, whose processes have at most one owner
    (the host counting as one): their device series carry the container's tags."""
    sole: Dict[TargetKey, Optional[Holder]] = {}
    for workload in workloads:
        sole[workload.target] = None if workload.target in sole else workload.holder
    # Workloads come in their targets' order, so walking the targets keeps the result's order.
    exclusive = {}
    for key, _, processes in targets:
        holder = sole.get(key)
        shared = claims.get(key) and claims[key].replicated
        if holder is not None and not shared and len(_owners_of(key, processes, owners)) <= 1:
            exclusive[key] = holder
    return exclusive


def _owners_of(key: TargetKey, processes: List[Process], owners: ProcessOwners) -> Set[HolderKey]:
    """Who runs the target's processes, by their own cgroups; the MPS server serves its clients."""
    host: HolderKey = ("host",)
    return {owners[(key, p.pid)].key if (key, p.pid) in owners else host for p in processes if not is_mps_server(p)}


def _process_holders(targets: Targets, holders: ProcessHolders) -> ProcessOwners:
    """Each process's owner from its own cgroup, never from whoever holds its GPU."""
    found = {}
    for (key, _instance, processes), owners in zip(targets, holders):
        for process, holder in zip(processes, owners):
            if holder is not None:
                found[(key, process.pid)] = holder
    return found
