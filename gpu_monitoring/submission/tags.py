"""Tag sets: a GPU, a MIG instance, a process, and the container that holds them."""

from typing import Iterable, List, Optional

from ..attribution import Holder, Tagger
from ..snapshot import Device, MigInstance, Process, Snapshot


def _pairs(values: dict) -> List[str]:
    return [f"{key}:{value}" for key, value in values.items() if value is not None]


def device_tags(device: Device, snapshot: Snapshot, slicing_mode: str) -> List[str]:
    return _pairs({
        "gpu_uuid": device.uuid,
        "gpu_index": device.index,
        "gpu_model": device.name,
        "gpu_architecture": device.architecture,
        "gpu_driver_version": snapshot.node.driver_version,
        "gpu_pci_bus_id": device.pci_bus_id,
        "gpu_slicing_mode": slicing_mode,
    })


def mig_tags(instance: MigInstance, parent: Device, parent_tags: List[str]) -> List[str]:
    kept = [t for t in parent_tags if not t.startswith(("gpu_uuid:", "gpu_slicing_mode:"))]
    return kept + _pairs({
        "gpu_uuid": instance.uuid,
        "gpu_parent_uuid": parent.uuid,
        "gpu_instance_id": instance.gpu_instance_id,
        "mig_profile": instance.profile,
        "gpu_slicing_mode": "mig",
    })


def process_tags(process: Process, target_tags: List[str], holder: Optional[Holder], tagger: Tagger) -> List[str]:
    own = _pairs({"pid": process.pid, "process_name": process.name})
    return merge(target_tags, own, holder.tags(tagger) if holder else ())


def merge(*groups: Iterable[str]) -> List[str]:
    """Concatenated tags without repeats, first occurrence first."""
    return list(dict.fromkeys(tag for group in groups for tag in group))
