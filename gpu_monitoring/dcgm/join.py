"""DCGM's profiling values put into the snapshot, under the names GPM's carry, where GPM gave none.

A GPU is found by its UUID, a MIG instance by its parent's UUID and its GPU instance ID (DCGM's
`GPU_I_ID`, NVML's GPU instance ID; each compute instance of a GPU instance gets its values, as
from GPM, which measures GPU instances too). Of a MIG instance only the activity is taken: a GPU instance
has no PCIe or NVLink of its own. A value the snapshot has already (GPM's activity, NVML's PCIe and
NVLink throughput) stays: DCGM fills only what is missing, and says so in `activity_source`.
"""

from typing import Dict, Iterable, List, Optional, Set, Tuple, Union

from gpu_monitoring.dcgm.exposition import METRICS, Sample, dcgm_key
from gpu_monitoring.metrics.names import (
    NVLINK_THROUGHPUT_RX,
    NVLINK_THROUGHPUT_TX,
    PCIE_THROUGHPUT_RX,
    PCIE_THROUGHPUT_TX,
)
from gpu_monitoring.snapshot import Device, MigInstance, Snapshot

SOURCE = "dcgm"
# Series of the whole GPU's links; every other field is activity.
LINK_METRICS = frozenset({PCIE_THROUGHPUT_TX, PCIE_THROUGHPUT_RX, NVLINK_THROUGHPUT_TX, NVLINK_THROUGHPUT_RX})

Entity = Union[Device, MigInstance]


def wanted(snapshot: Snapshot) -> Set[str]:
    """The metrics to take from the page: activity always (it also tells this node's GPUs from
    another's), PCIe and NVLink throughput only where a GPU lacks NVML's."""
    lacking = {m for d in snapshot.devices if d.uuid and not d.lost for m in LINK_METRICS - d.metrics.keys()}
    return (METRICS - LINK_METRICS) | lacking


def join(snapshot: Snapshot, samples: Iterable[Sample]) -> Set[str]:
    """Put the samples into the snapshot's GPUs and MIG instances; the UUIDs (dcgm_key) of the
    snapshot's GPUs the samples named, so that a page of another node's GPUs is told from this one's."""
    targets = _targets(snapshot)
    gpus = {key for key, instance in targets if instance is None}
    named: Set[str] = set()
    filled: Dict[int, Entity] = {}
    for sample in samples:
        if sample.gpu_uuid in gpus:
            named.add(sample.gpu_uuid)
        if sample.gpu_instance_id is not None and sample.metric in LINK_METRICS:
            continue
        for target in targets.get((sample.gpu_uuid, sample.gpu_instance_id), ()):
            if _fill(target, sample):
                filled[id(target)] = target
    for target in filled.values():
        target.activity_source = SOURCE
    return named


def _fill(target: Entity, sample: Sample) -> bool:
    """Whether the sample gave the target activity it lacked."""
    link = sample.metric in LINK_METRICS
    if sample.metric in target.metrics or (not link and target.activity_source not in (None, SOURCE)):
        return False  # NVML's or GPM's own measure stands
    target.metrics[sample.metric] = sample.value
    return not link


def _targets(snapshot: Snapshot) -> Dict[Tuple[str, Optional[int]], List[Entity]]:
    targets: Dict[Tuple[str, Optional[int]], List[Entity]] = {}
    for device in snapshot.devices:
        if device.uuid is None or device.lost:
            continue
        key = dcgm_key(device.uuid)
        targets[key, None] = [device]
        for instance in device.mig_instances:
            if instance.gpu_instance_id is not None:
                targets.setdefault((key, instance.gpu_instance_id), []).append(instance)
    return targets
