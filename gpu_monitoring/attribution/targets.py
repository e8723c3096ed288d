"""Where each pod-resources device ID points: a GPU, a MIG instance, or a shared replica of one."""

from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Set, Tuple

from ..kube.device_ids import DeviceRef, parse_device_id
from ..snapshot import Allocation, Device, MigInstance, Snapshot

# The kubelet names the same devices run after run: each ID is parsed once. An ID's parse depends
# on nothing but the ID, so it cannot go stale; the bound keeps the advertised replicas of a large
# node (GPUs and MIG instances times replicas each) well within it.
_parse_device_id = lru_cache(maxsize=4096)(parse_device_id)


@dataclass(frozen=True)
class Target:
    """A GPU (mig_uuid None) or one of its MIG instances, with the replica a shared ID names."""

    device_index: int
    mig_uuid: Optional[str]
    replica: Optional[int]


class TargetResolver:
    def __init__(self, snapshot: Snapshot):
        self._by_uuid: Dict[str, Device] = {d.uuid: d for d in snapshot.devices if d.uuid}
        self._by_minor: Dict[int, Device] = {d.minor_number: d for d in snapshot.devices if d.minor_number is not None}
        self._mig: Dict[str, Tuple[Device, MigInstance]] = {
            m.uuid: (d, m) for d in snapshot.devices for m in d.mig_instances
        }
        # An allocated ID is advertised too: each is resolved once per snapshot.
        self._resolved: Dict[str, Optional[Target]] = {}

    def resolve(self, device_id: str) -> Target:
        """The target of one device ID; ValueError says why it matches no device here."""
        if device_id not in self._resolved:
            self._resolved[device_id] = self._target(_parse_device_id(device_id))
        target = self._resolved[device_id]
        if target is None:
            raise ValueError(f"device {device_id} matches no GPU or MIG instance NVML sees")
        return target

    def _target(self, ref: DeviceRef) -> Optional[Target]:
        replica = ref.replica if ref.replica is not None else ref.vgpu
        if ref.uuid and ref.uuid in self._mig:
            device, instance = self._mig[ref.uuid]
            return Target(device.index, instance.uuid, replica)
        device = self._by_uuid.get(ref.uuid) if ref.uuid else self._by_minor.get(ref.minor)
        if device is None:
            return None
        if ref.gpu_instance is None:
            return Target(device.index, None, replica)
        instance = next((m for m in device.mig_instances if m.gpu_instance_id == ref.gpu_instance), None)
        return Target(device.index, instance.uuid, replica) if instance else None


def resolve_all(
    resolver: TargetResolver, snapshot: Snapshot, allocations: List[Allocation]
) -> Tuple[List[Tuple[Allocation, Target]], List[str]]:
    """Allocations with their targets, and a line for each one that points nowhere (none is dropped silently)."""
    resolved, problems = [], []
    for allocation in allocations:
        try:
            resolved.append((allocation, resolver.resolve(allocation.device_id)))
        except ValueError as e:
            problems.append(f"{allocation.namespace}/{allocation.pod}/{allocation.container}: {e}")
    unnamed = [str(d.index) for d in snapshot.devices if not d.uuid]
    if problems and unnamed:
        # NVML, not pod-resources, is at fault: one line for it rather than one per allocation.
        problems = [f"{len(problems)} allocations match no GPU while NVML does not tell the UUID of GPU "
                    f"{', '.join(unnamed)}: they cannot be matched until it does"]
    return resolved, problems


@dataclass
class Offer:
    """What the device plugins advertise, resolved: replicas per shared GPU or MIG instance (free ones
    included) and the GPUs Kubernetes can schedule at all."""

    replicas: Dict[Tuple[int, Optional[str]], int]
    devices: Set[int]


def advertised(resolver: TargetResolver, snapshot: Snapshot) -> Optional[Offer]:
    """None when the kubelet did not say (before 1.23, or the call failed)."""
    if snapshot.allocations.advertised is None:
        return None
    replicas: Dict[Tuple[int, Optional[str]], Set[str]] = {}
    devices: Set[int] = set()
    for device in snapshot.allocations.advertised:
        try:
            target = resolver.resolve(device.device_id)
        except ValueError:
            continue  # a device NVML does not see holds no pod's share
        devices.add(target.device_index)
        if target.replica is not None:
            replicas.setdefault((target.device_index, target.mig_uuid), set()).add(device.device_id)
    return Offer({key: len(ids) for key, ids in replicas.items()}, devices)
