"""Tag sets: a GPU, a MIG instance, a process, and the container that holds them.

Where the Agent's own `gpu` check tags the same thing, the key and the value's form are its own
(`gpu_uuid`, `gpu_device`, `gpu_architecture`, `gpu_driver_version`, `gpu_pci_bus_id`,
`gpu_slicing_mode`, `gpu_parent_uuid`, `gpu_mig_profile`), so that one dashboard filter or
template variable selects the same GPUs in both checks. Datadog lowercases tags when it stores
them; lowercasing here too keeps what the check prints equal to what Datadog shows.
"""

import re
from typing import Iterable, List, Optional

from ..attribution import DeviceView, Holder, Tagger
from ..snapshot import Device, MigInstance, Process, Snapshot

# Keys a MIG instance sets for itself instead of taking its parent's.
_OWN_MIG_KEYS = ("gpu_uuid:", "gpu_slicing_mode:", "gpu_sharing_mode:")
_NOT_IN_DEVICE_NAME = re.compile(r"[^a-z0-9_.-]+")


def _pairs(values: dict) -> List[str]:
    return [f"{key}:{value}" for key, value in values.items() if value is not None]


def _lower(value: Optional[str]) -> Optional[str]:
    return None if value is None else value.lower()


def device_name(model: Optional[str]) -> Optional[str]:
    """`gpu_device`'s value for an NVML product name, as the Agent's check writes it:
    "NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3"."""
    if model is None:
        return None
    return _NOT_IN_DEVICE_NAME.sub("_", model.strip().lower()).strip("_") or None


def device_tags(device: Device, snapshot: Snapshot, view: DeviceView) -> List[str]:
    uuid = _lower(device.uuid)
    return _pairs({
        "gpu_uuid": uuid,
        # The Agent's check gives a whole GPU its own UUID here, so this tag selects a GPU and
        # all its MIG instances alike.
        "gpu_parent_uuid": uuid,
        "gpu_index": device.index,
        "gpu_device": device_name(device.name),
        "gpu_architecture": _lower(device.architecture),
        "gpu_driver_version": snapshot.node.driver_version,
        "gpu_pci_bus_id": _lower(device.pci_bus_id),
        "gpu_slicing_mode": view.slicing_mode,
        "gpu_sharing_mode": view.sharing_mode((device.index, None)),
    })


def mig_tags(instance: MigInstance, parent: Device, parent_tags: List[str], view: DeviceView) -> List[str]:
    kept = [t for t in parent_tags if not t.startswith(_OWN_MIG_KEYS)]
    return kept + _pairs({
        "gpu_uuid": _lower(instance.uuid),
        "gpu_instance_id": instance.gpu_instance_id,
        "gpu_mig_profile": _lower(instance.profile),
        "gpu_slicing_mode": "mig",
        "gpu_sharing_mode": view.sharing_mode((parent.index, instance.uuid)),
    })


def process_tags(process: Process, target_tags: List[str], holder: Optional[Holder], tagger: Tagger) -> List[str]:
    step = process.slurm.step if process.slurm else None
    own = _pairs({"pid": process.pid, "process_name": process.name, "slurm_step": step})
    return merge(target_tags, own, holder.tags(tagger) if holder else ())


def merge(*groups: Iterable[str]) -> List[str]:
    """Concatenated tags without repeats, first occurrence first."""
    return list(dict.fromkeys(tag for group in groups for tag in group))
