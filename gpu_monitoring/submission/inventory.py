"""Inventory series, for drift across a fleet (DESIGN §13): `node.info` once per node, tagged with
its driver, CUDA driver and NVML versions and GPU models, and each GPU's `device.persistence_mode`
tagged with its VBIOS version. A dashboard or monitor counts hosts or GPUs by these tags.

A run's cost: the node's tags are made once for each set of versions and models, the VBIOS tag
once for each version.
"""

from functools import lru_cache
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from gpu_monitoring.metrics.names import DEVICE_PERSISTENCE_MODE, NODE_INFO
from gpu_monitoring.snapshot import Snapshot
from gpu_monitoring.submission.tags import device_name, merge

Send = Callable[[str, float, List[str]], None]
# A node's versions change with a driver upgrade, its models seldom: a few combinations a check's life.
_NODES_REMEMBERED = 16
_VBIOS_REMEMBERED = 64


def submit_inventory(send: Send, snapshot: Snapshot, base_tags: Sequence[str],
                     device_tags: Mapping[int, Sequence[str]]) -> None:
    """`node.info` with `base_tags`, and each GPU's `device.persistence_mode` with its tags in
    `device_tags` (by GPU index); `send` submits a series where the metrics profile sends it. A tag
    whose value is unknown is left out; a GPU whose persistence mode is unknown sends no series."""
    node = snapshot.node
    models = tuple(sorted({device.name for device in snapshot.devices if device.name}))
    send(NODE_INFO, 1, merge(base_tags, _node_tags(node.driver_version, node.cuda_driver_version,
                                                     node.nvml_version, models)))
    for device in snapshot.devices:
        if device.persistence_mode is not None:
            send(DEVICE_PERSISTENCE_MODE, int(device.persistence_mode),
                 [*device_tags[device.index], *_vbios_tags(device.vbios_version)])


@lru_cache(maxsize=_NODES_REMEMBERED)
def _node_tags(driver: Optional[str], cuda: Optional[str], nvml: Optional[str],
               models: Tuple[str, ...]) -> Tuple[str, ...]:
    versions = {"gpu_driver_version": driver, "cuda_driver_version": cuda, "nvml_version": nvml}
    names = sorted({name for name in map(device_name, models) if name})
    return (*(f"{key}:{value}" for key, value in versions.items() if value is not None),
            *(f"gpu_device:{name}" for name in names))


@lru_cache(maxsize=_VBIOS_REMEMBERED)
def _vbios_tags(version: Optional[str]) -> Tuple[str, ...]:
    # Datadog stores tags lower case: "96.00.74.00.0D" is shown as 96.00.74.00.0d.
    return () if version is None else (f"vbios_version:{version.lower()}",)
