"""Tag sets: a GPU, a MIG instance, a process, and the container that holds them.

Where the Agent's own `gpu` check tags the same thing, the key and the value's form are its own
(`gpu_uuid`, `gpu_device`, `gpu_architecture`, `gpu_driver_version`, `gpu_pci_bus_id`,
`gpu_slicing_mode`, `gpu_parent_uuid`, `gpu_mig_profile`), so that one dashboard filter or
template variable selects the same GPUs in both checks. Datadog lowercases tags when it stores
them; lowercasing here too keeps what the check prints equal to what Datadog shows.
"""

import re
from functools import lru_cache
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from gpu_monitoring.attribution.holders import Holder, Tagger
from gpu_monitoring.attribution.pipeline import DeviceView
from gpu_monitoring.snapshot import Device, MigInstance, Process, Snapshot

# Keys a MIG instance sets for itself instead of taking its parent's.
_OWN_MIG_KEYS = ("gpu_uuid:", "gpu_slicing_mode:", "gpu_sharing_mode:")
_NOT_IN_DEVICE_NAME = re.compile(r"[^a-z0-9_.-]+")
# A node's GPUs and MIG instances, each in a few sharing modes: far fewer than this.
_TARGETS_REMEMBERED = 256


def _pairs(values: dict) -> List[str]:
    return [f"{key}:{value}" for key, value in values.items() if value is not None]


def _lower(value: Optional[str]) -> Optional[str]:
    return None if value is None else value.lower()


@lru_cache(maxsize=_TARGETS_REMEMBERED)
def device_name(model: Optional[str]) -> Optional[str]:
    """`gpu_device`'s value for an NVML product name, as the Agent's check writes it:
    "NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3"."""
    if model is None:
        return None
    return _NOT_IN_DEVICE_NAME.sub("_", model.strip().lower()).strip("_") or None


def device_tags(device: Device, snapshot: Snapshot, view: DeviceView) -> Tuple[str, ...]:
    return _device_tags(
        device.uuid,
        device.index,
        device.name,
        device.architecture,
        snapshot.node.driver_version,
        device.pci_bus_id,
        view.slicing_mode,
        view.sharing_mode((device.index, None)),
        device.fabric_clique_id,
        device.fabric_cluster_uuid,
    )


# Every run asks again for tags that change only with the GPU's identity or sharing: made once
# for each combination of what they are made of, they cannot go stale.
@lru_cache(maxsize=_TARGETS_REMEMBERED)
def _device_tags(
    uuid: Optional[str],
    index: int,
    name: Optional[str],
    architecture: Optional[str],
    driver_version: Optional[str],
    pci_bus_id: Optional[str],
    slicing_mode: str,
    sharing_mode: str,
    clique_id: Optional[int] = None,
    cluster_uuid: Optional[str] = None,
) -> Tuple[str, ...]:
    uuid = _lower(uuid)
    return tuple(_pairs({
        "gpu_uuid": uuid,
        # The Agent's check gives a whole GPU its own UUID here, so this tag selects a GPU and
        # all its MIG instances alike.
        "gpu_parent_uuid": uuid,
        "gpu_index": index,
        "gpu_device": device_name(name),
        "gpu_architecture": _lower(architecture),
        "gpu_driver_version": driver_version,
        "gpu_pci_bus_id": _lower(pci_bus_id),
        "gpu_slicing_mode": slicing_mode,
        "gpu_sharing_mode": sharing_mode,
        # The NVLink fabric the GPU is registered with: one clique of one cluster is one NVLink
        # domain (an NVL72 rack, an HGX board), whose GPUs these group.
        "gpu_clique_id": clique_id,
        "gpu_cluster_uuid": _lower(cluster_uuid),
    }))


def mig_tags(instance: MigInstance, parent: Device, parent_tags: List[str], view: DeviceView) -> List[str]:
    kept = [t for t in parent_tags if not t.startswith(_OWN_MIG_KEYS)]
    return kept + _pairs({
        "gpu_uuid": _lower(instance.uuid),
        "gpu_instance_id": instance.gpu_instance_id,
        "gpu_mig_profile": _lower(instance.profile),
        "gpu_slicing_mode": "mig",
        "gpu_sharing_mode": view.sharing_mode((parent.index, instance.uuid)),
    })


def process_tags(process: Process, target_tags: List[str], holder_tags: Sequence[str]) -> List[str]:
    step = process.slurm.step if process.slurm else None
    own = _pairs({"pid": process.pid, "process_name": process.name, "slurm_step": step})
    return merge(target_tags, own, holder_tags)


def claim_tags(claims: Iterable[Tuple[str, str]]) -> List[str]:
    """The DRA ResourceClaims, as (namespace, name), a workload holds its GPU or MIG instance by."""
    tags: List[str] = []
    for namespace, name in claims:
        tags += [f"dra_claim_name:{name}", f"dra_claim_namespace:{namespace}"]
    return tags


class HolderTags:
    """The tags of the containers and Slurm jobs that hold or use GPUs, for one run: one container's
    series (its GPU's, each of its processes', its workload's) ask for them several times, and each
    answer takes a call to the Agent's tagger. Make a new one each run: the tagger's answer can
    change from one run to the next."""

    def __init__(self, tagger: Tagger):
        self._tagger = tagger
        self._known: Dict[tuple, Tuple[str, ...]] = {}

    def __call__(self, holder: Holder) -> Tuple[str, ...]:
        # Everything Holder.tags reads: holders made apart for one container share their answer.
        key = (holder.slurm, holder.container_id, holder.pod, holder.namespace, holder.container)
        tags = self._known.get(key)
        if tags is None:
            tags = self._known[key] = tuple(holder.tags(self._tagger))
        return tags


def merge(*groups: Iterable[str]) -> List[str]:
    """Concatenated tags without repeats, first occurrence first."""
    tags: List[str] = []
    for group in groups:
        tags += group
    # The groups seldom share a tag: telling so costs less than building the list anew without repeats.
    return tags if len(set(tags)) == len(tags) else list(dict.fromkeys(tags))
