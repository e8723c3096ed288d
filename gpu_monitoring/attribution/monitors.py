"""Pods that watch every GPU of the node through admin-access DRA claims rather than hold any.

A monitoring DaemonSet in DRA mode (dcgm-exporter's `nvidia-dcgm-exporter-dra`) claims every GPU
with admin access, which does not allocate them. pod-resources does not say a claim is one: that is
in the ResourceClaim object, which only the API server serves. Kubernetes gives a device to one
claim at a time unless that claim has admin access or the device is shared (a share ID), so a pod is
taken for such a monitor when its claims cover every GPU and it is a DaemonSet's, or another pod's
unshared claim holds one of those GPUs at the same time.
"""

from typing import Dict, List, Set, Tuple

from gpu_monitoring.attribution.holders import PodDirectory
from gpu_monitoring.attribution.places import Place
from gpu_monitoring.snapshot import Allocation, Device

PodKey = Tuple[str, str]  # (namespace, name)


def monitors(resolved: List[Tuple[Allocation, Place]], devices: List[Device], directory: PodDirectory) -> Set[PodKey]:
    covered: Dict[PodKey, Set[int]] = {}
    for allocation, place in resolved:
        if allocation.dynamic:
            covered.setdefault((allocation.namespace, allocation.pod), set()).add(place.device_index)
    every = {d.index for d in devices}
    candidates = {pod for pod, gpus in covered.items() if every and gpus >= every}
    if not candidates:
        return set()
    # Two pods that both cover every GPU could each be the monitor: only a pod that does not is a witness.
    overlapped = {place.device_index for allocation, place in resolved
                  if allocation.dynamic and allocation.share_id is None
                  and (allocation.namespace, allocation.pod) not in candidates}
    return {pod for pod in candidates if directory.controller_kind(*pod) == "DaemonSet" or covered[pod] & overlapped}
