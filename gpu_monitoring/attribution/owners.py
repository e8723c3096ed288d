"""Who runs each process on a target: its owner by its own cgroup, never by whoever holds its GPU."""

from typing import Dict, List, Tuple

from gpu_monitoring.attribution.holders import Holder, PodDirectory
from gpu_monitoring.attribution.targets import Target, TargetKey

ProcessOwners = Dict[Tuple[TargetKey, int], Holder]  # processes without a container or job have none


def owners(held: List[Target], directory: PodDirectory) -> ProcessOwners:
    """Each process's owner, looked up once: its own series and its workload both use it."""
    found = {}
    for target in held:
        for process in target.processes:
            holder = directory.for_process(process)
            if holder is not None:
                found[(target.key, process.pid)] = holder
    return found
