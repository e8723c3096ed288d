"""Where each allocated or advertised device points: a GPU, a MIG instance, or a shared replica of one.

Device plugins name devices by the IDs `kube.device_ids` parses; NVIDIA's DRA driver by the names
`kube.dra_names` parses.
"""

from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

from ..kube.device_ids import DeviceRef, parse_device_id
from ..kube.dra_names import DraDeviceRef, parse_dra_name, profile_in_name
from ..snapshot import Allocation, Device, MigInstance

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
    """The MIG instance a DRA name picks on its GPU. A snapshot's instance tells its profile name but
    not its GI profile ID or placement: the name picks the one instance of its profile, and a name of
    the older scheme (which has no profile name) the GPU's one instance."""
    candidates = [m for m in device.mig_instances
                  if ref.profile is None or (m.profile and profile_in_name(m.profile) == ref.profile)]
    if len(candidates) == 1:
        return candidates[0]
    named = f"profile {ref.profile}" if ref.profile else f"GI profile {ref.profile_id}"
    if not candidates:
        raise ValueError(f"device {ref.raw} names a MIG device of {named} on GPU {device.index}, which has none")
    raise ValueError(f"device {ref.raw} names a MIG device of {named} at placement {ref.placement_start} on "
                     f"GPU {device.index}, which has {len(candidates)} such instances: NVML's placements are "
                     "not read, so which one it is cannot be told")
