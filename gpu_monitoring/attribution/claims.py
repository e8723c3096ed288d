"""Who holds each target: the devices the kubelet gave containers through device plugins or DRA
claims, what the device plugins offer, and how each target is shared."""

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Set, Tuple

from gpu_monitoring.attribution.holders import Holder, HolderKey, PodDirectory
from gpu_monitoring.attribution.monitors import monitors
from gpu_monitoring.attribution.places import Place, Places
from gpu_monitoring.attribution.targets import Target, TargetKey, is_mps_server
from gpu_monitoring.snapshot import Advertised, Allocation, Device, Process, Snapshot

ClaimRef = Tuple[str, str]  # a DRA ResourceClaim's (namespace, name)


@dataclass
class Claims:
    """Who holds one target, and which shared replicas or DRA claims they hold it by."""

    holders: Dict[HolderKey, Holder] = field(default_factory=dict)
    replicas: Dict[HolderKey, Set[int]] = field(default_factory=dict)
    shared_resource: bool = False  # a `.shared` resource, or a DRA claim with a share ID
    advertised: Optional[int] = None  # replicas the device plugin advertises, held or free
    dynamic: Dict[ClaimRef, Set[HolderKey]] = field(default_factory=dict)  # each DRA claim's holders

    def add(self, holder: Holder, allocation: Allocation, replica: Optional[int]) -> None:
        self.holders.setdefault(holder.key, holder)
        if replica is not None:
            self.replicas.setdefault(holder.key, set()).add(replica)
        if allocation.dynamic:
            # A ResourceClaim lives in its pod's namespace (Kubernetes: pods reference claims by name only).
            claim = (allocation.claim_namespace or allocation.namespace, allocation.claim_name or "")
            self.dynamic.setdefault(claim, set()).add(holder.key)
            self.shared_resource |= allocation.share_id is not None
        else:
            self.shared_resource |= allocation.resource_name.endswith(".shared")

    @property
    def replicated(self) -> bool:
        return bool(self.replicas) or self.shared_resource or len(self.dynamic) > 1

    def replica_count(self) -> int:
        """What the device plugin advertises; without that, replica IDs run 0..N-1, so the highest
        one held bounds N from below (and overstates shares while replicas are free)."""
        held = [r for ids in self.replicas.values() for r in ids]
        if self.advertised:
            return max(self.advertised, len(held), len(self.holders))
        return max(len(held), max(held, default=-1) + 1, len(self.holders))

    def share(self, key: HolderKey) -> float:
        if self.dynamic:
            # Each DRA claim on the device is an equal part of it, split among the containers that use the claim.
            return sum(1 / len(holders) for holders in self.dynamic.values() if key in holders) / len(self.dynamic)
        if not self.replicated:
            return 1.0 / len(self.holders)
        return max(1, len(self.replicas.get(key, ()))) / self.replica_count()

    def claims_of(self, key: HolderKey) -> List[ClaimRef]:
        return [claim for claim, holders in self.dynamic.items() if key in holders]


@dataclass
class Offer:
    """What the device plugins advertise, resolved: replicas per shared GPU or MIG instance (free ones
    included) and the GPUs Kubernetes can schedule at all."""

    replicas: Dict[TargetKey, int]
    devices: Set[int]


@dataclass
class Claimed:
    """The claims stage's answer for the node."""

    targets: Dict[TargetKey, Claims]
    sharing: Dict[int, Dict[TargetKey, str]]  # per GPU: none | time_slicing | mps per target
    allocated: Set[int]  # GPUs given to containers (without pod-resources: GPUs running compute)
    offered: Dict[int, Optional[bool]]  # does a device plugin advertise the GPU; None when the kubelet did not say
    allocatable: Optional[Dict[int, bool]]  # the funnel's `allocatable`; None when it cannot be told
    problems: List[str]
    from_pod_resources: bool


def claims(snapshot: Snapshot, held: List[Target], directory: PodDirectory) -> Claimed:
    if snapshot.allocations.source != "pod_resources":
        jobs = _slurm_claims(snapshot)
        allocated = {d.index for d in snapshot.devices if _in_use(d, directory)} | {key[0] for key in jobs}
        unknown = dict.fromkeys((d.index for d in snapshot.devices), None)
        return Claimed(jobs, _sharing(held, jobs), allocated, unknown, None, [], False)
    # One resolver for both allocations and advertised IDs: most IDs are in both, resolved once.
    places = Places(snapshot.devices)
    resolved, problems = _resolve_all(places, snapshot)
    # pod-resources can list a finished pod until the kubelet garbage-collects it.
    live = [(a, place) for a, place in resolved if not directory.is_terminal(a.namespace, a.pod)]
    dynamic = any(a.dynamic for a in snapshot.allocations.items)
    watching = monitors(live, snapshot.devices, directory) if dynamic else set()
    offer = _advertised(places, snapshot.allocations.advertised)
    found: Dict[TargetKey, Claims] = {}
    for allocation, place in live:
        if (allocation.namespace, allocation.pod) not in watching:
            held_by = found.setdefault(place.key, Claims(advertised=offer.replicas.get(place.key) if offer else None))
            held_by.add(directory.for_allocation(allocation), allocation, place.replica)
    offered, allocatable = _offered(snapshot.devices, offer, dynamic)
    return Claimed(
        targets=found,
        sharing=_sharing(held, found),
        allocated={key[0] for key in found},
        offered=offered,
        allocatable=allocatable,
        problems=problems,
        from_pod_resources=True,
    )


def _in_use(device: Device, directory: PodDirectory) -> bool:
    """Runs a compute process of anyone's but a finished pod's: what is left of one holds nothing."""
    processes = device.processes + [p for i in device.mig_instances for p in i.processes]
    owners = (directory.for_process(p) for p in processes if p.kind == "compute")
    return any(owner is None or not owner.finished for owner in owners)


def _slurm_claims(snapshot: Snapshot) -> Dict[TargetKey, Claims]:
    """The GPUs Slurm gave each job on the node, held whether or not the job runs anything on them. A job
    is given whole GPUs by minor number; a GPU in MIG mode is left to its instances' processes."""
    by_minor = {d.minor_number: d for d in snapshot.devices if d.minor_number is not None and not d.mig_instances}
    found: Dict[TargetKey, Claims] = {}
    for allocation in snapshot.node.slurm_allocations or ():
        job = replace(allocation.job, step=None)
        for minor in allocation.gpu_minors:
            if minor in by_minor:
                holder = Holder(key=("slurm", job.job_id), slurm=job)
                found.setdefault((by_minor[minor].index, None), Claims()).holders.setdefault(holder.key, holder)
    return found


def _resolve_all(places: Places, snapshot: Snapshot) -> Tuple[List[Tuple[Allocation, Place]], List[str]]:
    """Allocations with their places, and a line for each one that points nowhere (none is dropped silently)."""
    resolved, plugins, dynamic = [], [], []
    for allocation in snapshot.allocations.items:
        try:
            resolved.append((allocation, places.of(allocation)))
        except ValueError as e:
            (dynamic if allocation.dynamic else plugins).append(f"{_holder_name(allocation)}: {e}")
    unnamed = [str(d.index) for d in snapshot.devices if not d.uuid]
    if plugins and unnamed:
        # NVML, not pod-resources, is at fault: one line for it rather than one per allocation.
        plugins = [f"{len(plugins)} allocations match no GPU while NVML does not tell the UUID of GPU "
                   f"{', '.join(unnamed)}: they cannot be matched until it does"]
    return resolved, plugins + dynamic


def _holder_name(allocation: Allocation) -> str:
    name = f"{allocation.namespace}/{allocation.pod}/{allocation.container}"
    return f"{name} (claim {allocation.claim_namespace}/{allocation.claim_name})" if allocation.dynamic else name


def _advertised(places: Places, advertised: Optional[List[Advertised]]) -> Optional[Offer]:
    """None when the kubelet did not say (before 1.23, or the call failed)."""
    if advertised is None:
        return None
    replicas: Dict[TargetKey, Set[str]] = {}
    devices: Set[int] = set()
    for device in advertised:
        try:
            place = places.resolve(device.device_id)
        except ValueError:
            continue  # a device NVML does not see holds no pod's share
        devices.add(place.device_index)
        if place.replica is not None:
            replicas.setdefault(place.key, set()).add(device.device_id)
    return Offer({key: len(ids) for key, ids in replicas.items()}, devices)


def _offered(
    devices: List[Device], offer: Optional[Offer], dynamic: bool
) -> Tuple[Dict[int, Optional[bool]], Optional[Dict[int, bool]]]:
    """Whether a device plugin offers each GPU, and which GPUs Kubernetes can give out.
    GetAllocatableResources lists no DRA device (kubelet podresources v1 API: device plugins'
    devices, CPUs and memory only) while NVIDIA's DRA driver publishes every GPU NVML enumerates: on
    a node with DRA claims the GPUs that are not lost are allocatable, and no device plugin's offer
    says anything of a GPU's health."""
    if dynamic:
        return dict.fromkeys((d.index for d in devices), None), {d.index: not d.lost for d in devices}
    # A GPU whose UUID NVML cannot tell matches no advertised ID: unknown, not refused.
    offered = {d.index: None if offer is None or not d.uuid else d.index in offer.devices for d in devices}
    if any(known is None for known in offered.values()):
        return offered, None
    return offered, {index: bool(known) for index, known in offered.items()}


def _sharing(held: List[Target], found: Dict[TargetKey, Claims]) -> Dict[int, Dict[TargetKey, str]]:
    """How each GPU or MIG instance is shared between containers: the Agent's check has no tag for
    this, so it is a tag of its own rather than more values of `gpu_slicing_mode`."""
    modes: Dict[int, Dict[TargetKey, str]] = {}
    for target in held:
        modes.setdefault(target.key[0], {})[target.key] = _sharing_mode(target.processes, found.get(target.key))
    return modes


def _sharing_mode(processes: List[Process], claims: Optional[Claims]) -> str:
    if any(p.kind == "mps" or is_mps_server(p) for p in processes):
        return "mps"
    return "time_slicing" if claims and claims.replicated else "none"

