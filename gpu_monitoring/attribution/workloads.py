"""Workloads: each container's share of each GPU or MIG instance it holds or uses, and how busy it is."""

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from gpu_monitoring.attribution.activity import measured_activity
from gpu_monitoring.attribution.claims import Claimed, ClaimRef, Claims
from gpu_monitoring.attribution.holders import Holder, HolderKey
from gpu_monitoring.attribution.owners import ProcessOwners
from gpu_monitoring.attribution.targets import Target, TargetKey, is_mps_server
from gpu_monitoring.snapshot import CgroupUse, Device, MigInstance, Process

MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
HOST_KEY: HolderKey = ("host",)  # the host's own processes, in no container or job
_SLICES = re.compile(r"^(\d+)g\.")


@dataclass
class Workload:
    target: TargetKey
    holder: Holder
    gpus: float
    memory_used: float
    sm_utilization: Optional[float]
    sm_limit: Optional[float]
    idle: bool
    dra_claims: List[ClaimRef] = field(default_factory=list)  # the DRA claims the holder holds the target by
    processes: List[Process] = field(default_factory=list)  # the holder's processes on the target
    # What the holder's cgroup showed over the interval, and why it is idle or below effective_threshold
    # (idle_reasons); None where it is neither.
    cpu: Optional[CgroupUse] = None
    idle_reason: Optional[str] = None


@dataclass
class Workloads:
    all: List[Workload]
    exclusive: Dict[int, Dict[TargetKey, Holder]]  # per GPU: targets one container holds alone, unshared


def workloads(held: List[Target], claimed: Claimed, owners: ProcessOwners) -> Workloads:
    found: List[Workload] = []
    for target in held:
        found += _target_workloads(target, claimed.targets.get(target.key) or Claims(), owners,
                                   claimed.from_pod_resources)
    return Workloads(found, _exclusive_holders(held, found, claimed.targets, owners))


def _target_workloads(target: Target, claims: Claims, owners: ProcessOwners, on_kubernetes: bool) -> List[Workload]:
    users = _adopt(_users(target, owners, on_kubernetes), claims)
    holders = dict(claims.holders)
    for holder_key, (holder, _) in users.items():
        holders.setdefault(holder_key, holder)
    fraction = _instance_fraction(target.device, target.instance)
    activity = measured_activity(target.instance or target.device)
    found = []
    for holder_key, holder in holders.items():
        share = _share(claims, holder_key, len(holders), on_kubernetes)
        processes = users.get(holder_key, (holder, []))[1]
        found.append(_workload(target.key, holder, share * fraction, processes, activity and activity[0],
                               claims.claims_of(holder_key), sole=len(holders) == 1))
    return found


def _exclusive_holders(
    held: List[Target], found: List[Workload], claims: Dict[TargetKey, Claims], owners: ProcessOwners
) -> Dict[int, Dict[TargetKey, Holder]]:
    """Targets held by exactly one container, not shared, whose processes have at most one owner
    (the host counting as one): their device series carry the container's tags."""
    sole: Dict[TargetKey, Optional[Holder]] = {}
    for workload in found:
        sole[workload.target] = None if workload.target in sole else workload.holder
    exclusive: Dict[int, Dict[TargetKey, Holder]] = {}
    for target in held:
        holder = sole.get(target.key)
        shared = claims.get(target.key) and claims[target.key].replicated
        if holder is not None and not shared and len(_owners_of(target, owners)) <= 1:
            exclusive.setdefault(target.key[0], {})[target.key] = holder
    return exclusive


def _owners_of(target: Target, owners: ProcessOwners) -> Set[HolderKey]:
    """Who runs the target's processes, by their own cgroups; the MPS server serves its clients."""
    return {owners[(target.key, p.pid)].key if (target.key, p.pid) in owners else HOST_KEY
            for p in target.processes if not is_mps_server(p)}


def _adopt(users: Dict[HolderKey, Tuple[Holder, List[Process]]], claims: Claims) -> Dict:
    """Without the kubelet a process is known only by its container ID. On a target exactly one
    container was given and exactly one container uses, that use is the given container's: its
    workload is not idle. The processes' own series keep their own owner either way."""
    unnamed = [key for key in users if key[0] == "container"]
    if len(claims.holders) != 1 or len(unnamed) != 1:
        return users
    (owner_key, owner), = claims.holders.items()
    adopted = {}
    for key, (holder, processes) in users.items():
        if key[0] == "container" and not owner.container_id:
            owner.container_id = holder.container_id
            key, holder = owner_key, owner
        adopted.setdefault(key, (holder, []))[1].extend(processes)
    return adopted


def _share(claims: Claims, key: HolderKey, holders: int, on_kubernetes: bool) -> float:
    """What the kubelet gave the container; on Kubernetes a container using a GPU it was not given
    holds none of it. Off Kubernetes the containers using a GPU split it evenly."""
    if claims.holders or on_kubernetes:
        return claims.share(key) if key in claims.holders else 0.0
    return 1.0 / holders


def _users(target: Target, owners: ProcessOwners, on_kubernetes: bool) -> Dict[HolderKey, Tuple[Holder, List[Process]]]:
    """Containers and jobs running processes on a target; the MPS server works for its clients, not as a
    workload. Off Kubernetes the host's own processes use what they run on like any workload: a node
    running its jobs outside containers spends its GPU-hours on them, not on capacity nobody holds."""
    users: Dict[HolderKey, Tuple[Holder, List[Process]]] = {}
    for process in target.processes:
        holder = owners.get((target.key, process.pid)) or (None if on_kubernetes else Holder(HOST_KEY))
        # A finished pod is no workload, whatever its processes left behind (idle_reasons calls them zombies).
        if holder is not None and not holder.finished and not is_mps_server(process):
            users.setdefault(holder.key, (holder, []))[1].append(process)
    return users


def _workload(
    target: TargetKey,
    holder: Holder,
    gpus: float,
    processes: List[Process],
    activity: Optional[float],
    dra_claims: List[ClaimRef],
    sole: bool = False,
) -> Workload:
    """`activity`: the target's SM (else graphics-engine) activity where GPM or DCGM measured it; `sole`:
    the holder is the target's only one."""
    sm_known = [p.sm_utilization for p in processes if p.sm_utilization is not None]
    # No process at all ran nothing. Processes NVML gives no samples of (a MIG instance's: per-process
    # utilization is not supported in MIG mode, nvml.h nvmlDeviceGetProcessUtilization) ran what their
    # target's measured activity says, where they are its only holder's; otherwise: unknown.
    sm = sum(sm_known) if sm_known or not processes else (activity if sole else None)
    limit = holder.env.get(MPS_THREAD_PERCENTAGE)
    return Workload(
        target=target,
        holder=holder,
        gpus=gpus,
        memory_used=float(sum(p.used_memory or 0 for p in processes)),
        sm_utilization=sm,
        sm_limit=float(limit) if limit and limit.replace(".", "", 1).isdigit() else None,
        # No process at all, or processes that ran no kernel since the last run: by their own SM use
        # where NVML samples it, and by the target's activity where it is measured (a MIG instance's
        # processes have no samples of their own; a process can sit on a GPU that does nothing).
        idle=not processes or (sm is not None and sm == 0) or activity == 0,
        dra_claims=dra_claims,
        processes=processes,
    )


def _instance_fraction(device: Device, instance: Optional[MigInstance]) -> float:
    """A MIG instance's share of its GPU: its compute slices out of the GPU's seven (four on A30)."""
    if instance is None:
        return 1.0
    match = _SLICES.match(instance.profile or "")
    total = 4 if "A30" in (device.name or "") else 7
    return min(1.0, int(match.group(1)) / total) if match else 1.0 / max(1, len(device.mig_instances))
