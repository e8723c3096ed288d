"""Where each allocated or advertised device points: a GPU, a MIG instance, or a shared replica of one.

Device plugins name devices by the IDs `kube.device_ids` parses; NVIDIA's DRA driver by the names
`kube.dra_names` parses.
"""

from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

from gpu_monitoring.kube.device_ids import DeviceRef, parse_device_id
from gpu_monitoring.kube.dra_names import DraDeviceRef, parse_dra_name, profile_in_name
from gpu_monitoring.snapshot import Allocation, Device, MigInstance

# The kubelet names the same devices run after run: each ID is parsed once. An ID's parse depends
# on nothing but the ID, so it cannot go stale; the bound keeps the advertised replicas of a large
# node (GPUs and MIG instances times replicas each) well within it.
_parse_device_id = lru_cache(maxsize=4096)(parse_device_id)
_parse_dra_name = lru_cache(maxsize=1024)(parse_dra_name)
_NOWHERE = "matches no GPU or MIG instance NVML sees"


@dataclass(frozen=True)
class Place:
    """A GPU (mig_uuid None) or one of its MIG instances, with the replica a shared ID names."""

    device_index: int
    mig_uuid: Optional[str]
    replica: Optional[int] = None

    @property
    def key(self) -> Tuple[int, Optional[str]]:
        return self.device_index, self.mig_uuid


class Places:
    def __init__(self, devices: List[Device]):
        self._by_uuid: Dict[str, Device] = {d.uuid: d for d in devices if d.uuid}
        self._by_minor: Dict[int, Device] = {d.minor_number: d for d in devices if d.minor_number is not None}
        self._mig: Dict[str, Tuple[Device, MigInstance]] = {m.uuid: (d, m) for d in devices for m in d.mig_instances}
        # An allocated ID is advertised too: each is resolved once per snapshot.
        self._resolved: Dict[Tuple[bool, str], Optional[Place]] = {}

    def of(self, allocation: Allocation) -> Place:
        """Where one allocation points; ValueError says why it points nowhere NVML sees."""
        return self.resolve(allocation.device_id, allocation.dynamic)

    def resolve(self, name: str, dynamic: bool = False) -> Place:
        """The place of a device plugin's ID, or of a DRA device name; ValueError says why it matches nothing."""
        if (dynamic, name) not in self._resolved:
            self._resolved[(dynamic, name)] = self._dra(_parse_dra_name(name)) if dynamic else \
                self._plugin(_parse_device_id(name))
        place = self._resolved[(dynamic, name)]
        if place is None:
            raise ValueError(f"device {name} {_NOWHERE}")
        return place

    def _plugin(self, ref: DeviceRef) -> Optional[Place]:
        replica = ref.replica if ref.replica is not None else ref.vgpu
        if ref.uuid and ref.uuid in self._mig:
            device, instance = self._mig[ref.uuid]
            return Place(device.index, instance.uuid, replica)
        device = self._by_uuid.get(ref.uuid) if ref.uuid else self._by_minor.get(ref.minor)
        if device is None:
            return None
        if ref.gpu_instance is None:
            return Place(device.index, None, replica)
        instance = next((m for m in device.mig_instances if m.gpu_instance_id == ref.gpu_instance), None)
        return Place(device.index, instance.uuid, replica) if instance else None

    def _dra(self, ref: DraDeviceRef) -> Optional[Place]:
        device = self._by_minor.get(ref.minor)
        if device is None or not ref.mig:
            return Place(device.index, None) if device else None
        return Place(device.index, _mig_instance(device, ref).uuid)


def _mig_instance(device: Device, ref: DraDeviceRef) -> MigInstance:
    """The MIG instance a DRA name picks on its GPU: the one whose GPU instance NVML places where the
    name says (profile ID and start; the size too in the older scheme, the profile name in the newer)."""
    found = [m for m in device.mig_instances if _placed_as(m, ref)]
    if len(found) == 1:
        return found[0]
    unread = [m for m in device.mig_instances if m.gpu_instance_profile_id is None or m.placement_start is None]
    if unread:
        raise ValueError(f"device {ref.raw}: NVML did not tell the placement of {len(unread)} MIG instance(s) "
                         f"of GPU {device.index}, so which one it names cannot be told")
    raise ValueError(f"device {ref.raw} names GI profile {ref.profile_id} at slice {ref.placement_start} of "
                     f"GPU {device.index}, where no MIG instance is")


def _placed_as(instance: MigInstance, ref: DraDeviceRef) -> bool:
    return (
        instance.gpu_instance_profile_id == ref.profile_id
        and instance.placement_start == ref.placement_start
        and ref.placement_size in (None, instance.placement_size)
        and (ref.profile is None or (instance.profile is not None and profile_in_name(instance.profile) == ref.profile))
    )
