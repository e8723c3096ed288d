"""Workloads: each container's share of each GPU or MIG instance it holds or uses, and how busy it is."""

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from ..snapshot import Allocation, Device, MigInstance, Process
from .fleet import measured_activity
from .holders import Holder, HolderKey, PodDirectory
from .targets import Target

MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
_SLICES = re.compile(r"^(\d+)g\.")
TargetKey = Tuple[int, Optional[str]]  # (GPU index, MIG instance UUID or None)
Targets = List[Tuple[TargetKey, Optional[MigInstance], List[Process]]]
ProcessHolders = List[List[Optional[Holder]]]  # per target, each process's owner (None: no container)


@dataclass
class Workload:
    target: TargetKey
    holder: Holder
    gpus: float
    memory_used: float
    sm_utilization: Optional[float]
    sm_limit: Optional[float]
    idle: bool


@dataclass
class Claims:
    """Who holds one target through pod-resources, and which shared replicas they hold."""

    holders: Dict[HolderKey, Holder] = field(default_factory=dict)
    replicas: Dict[HolderKey, Set[int]] = field(default_factory=dict)
    shared_resource: bool = False
    advertised: Optional[int] = None  # replicas the device plugin advertises, held or free

    def add(self, holder: Holder, allocation: Allocation, replica: Optional[int]) -> None:
        self.holders.setdefault(holder.key, holder)
        if replica is not None:
            self.replicas.setdefault(holder.key, set()).add(replica)
        self.shared_resource |= allocation.resource_name.endswith(".shared")

    @property
    def replicated(self) -> bool:
        return bool(self.replicas) or self.shared_resource

    def replica_count(self) -> int:
        """What the device plugin advertises; without that, replica IDs run 0..N-1, so the highest
        one held bounds N from below (and overstates shares while replicas are free)."""
        held = [r for ids in self.replicas.values() for r in ids]
        if self.advertised:
            return max(self.advertised, len(held), len(self.holders))
        return max(len(held), max(held, default=-1) + 1, len(self.holders))

    def share(self, key: HolderKey) -> float:
        if not self.replicated:
            return 1.0 / len(self.holders)
        return max(1, len(self.replicas.get(key, ()))) / self.replica_count()


def claims_by_target(
    resolved: List[Tuple[Allocation, Target]],
    directory: PodDirectory,
    advertised: Optional[Dict[TargetKey, int]] = None,
) -> Dict[TargetKey, Claims]:
    """Who holds each target; `advertised` (replicas per target) sets how finely a shared one is cut."""
    claims: Dict[TargetKey, Claims] = {}
    for allocation, target in resolved:
        if directory.is_terminal(allocation.namespace, allocation.pod):
            continue  # pod-resources can list a finished pod until the kubelet garbage-collects it
        key = (target.device_index, target.mig_uuid)
        found = claims.setdefault(key, Claims(advertised=(advertised or {}).get(key)))
        found.add(directory.for_allocation(allocation), allocation, target.replica)
    return claims


def targets_of(device: Device) -> Targets:
    if device.mig_instances:
        return [((device.index, m.uuid), m, m.processes) for m in device.mig_instances]
    return [((device.index, None), None, device.processes)]


def slicing_mode(device: Device) -> str:
    """MIG partitioning only, with the values of the Agent's own gpu check (its MIG instances are
    `mig`), so that one `gpu_slicing_mode` filter selects the same GPUs in both."""
    return "mig-parent" if device.mig_enabled else "none"


def sharing_modes(targets: Targets, claims: Dict[TargetKey, Claims]) -> Dict[TargetKey, str]:
    """How each GPU or MIG instance is shared between containers: the Agent's check has no tag for
    this, so it is a tag of its own rather than more values of `gpu_slicing_mode`."""
    return {key: _sharing_mode(processes, claims.get(key)) for key, _, processes in targets}


def _sharing_mode(processes: List[Process], claims: Optional[Claims]) -> str:
    if any(p.kind == "mps" or is_mps_server(p) for p in processes):
        return "mps"
    return "time_slicing" if claims and claims.replicated else "none"


def build_workloads(
    device: Device, targets: Targets, owners: ProcessHolders, claims: Dict[TargetKey, Claims], on_kubernetes: bool
) -> List[Workload]:
    """`owners` are the owners of the targets' processes, in the order of `targets_of(device)`."""
    workloads = []
    for (key, instance, processes), process_owners in zip(targets, owners):
        target_claims = claims.get(key) or Claims()
        users = _adopt(_users(processes, process_owners), target_claims)
        holders = dict(target_claims.holders)
        for holder_key, (holder, _) in users.items():
            holders.setdefault(holder_key, holder)
        fraction = _instance_fraction(device, instance)
        activity = measured_activity(instance or device)
        for holder_key, holder in holders.items():
            share = _share(target_claims, holder_key, len(holders), on_kubernetes)
            processes = users.get(holder_key, (holder, []))[1]
            workloads.append(_workload(key, holder, share * fraction, processes, activity and activity[0]))
    return workloads


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


def is_mps_server(process: Process) -> bool:
    return (process.name or "").startswith("nvidia-cuda-mps")


def _users(processes: List[Process], owners: List[Optional[Holder]]) -> Dict[HolderKey, Tuple[Holder, List[Process]]]:
    """Containers running processes on a target; the MPS server works for its clients, not as a workload."""
    users: Dict[HolderKey, Tuple[Holder, List[Process]]] = {}
    for process, holder in zip(processes, owners):
        if holder is not None and not is_mps_server(process):
            users.setdefault(holder.key, (holder, []))[1].append(process)
    return users


def _workload(
    target: TargetKey, holder: Holder, gpus: float, processes: List[Process], activity: Optional[float]
) -> Workload:
    """`activity`: the target's SM (else graphics-engine) activity where GPM or DCGM measured it."""
    sm_known = [p.sm_utilization for p in processes if p.sm_utilization is not None]
    # No process at all ran nothing; processes on a device without per-process sampling: unknown.
    sm = sum(sm_known) if sm_known or not processes else None
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
    )


def _instance_fraction(device: Device, instance: Optional[MigInstance]) -> float:
    """A MIG instance's share of its GPU: its compute slices out of the GPU's seven (four on A30)."""
    if instance is None:
        return 1.0
    match = _SLICES.match(instance.profile or "")
    total = 4 if "A30" in (device.name or "") else 7
    return min(1.0, int(match.group(1)) / total) if match else 1.0 / max(1, len(device.mig_instances))
