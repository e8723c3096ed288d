"""Who runs each process on a target: its owner by its own cgroup, never by whoever holds its GPU; and
who ran the process an XID hit, as the kernel's line names it (node.kernel_events read its cgroup)."""

from typing import Dict, List, Tuple

from gpu_monitoring.attribution.holders import Holder, PodDirectory
from gpu_monitoring.attribution.targets import Target, TargetKey
from gpu_monitoring.snapshot import Event, Process

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


def event_owners(events: List[Event], directory: PodDirectory) -> Dict[int, Holder]:
    """The owner of each XID's process, by the event's position in the run's events: an application XID is
    its owner's fault, to be seen by workload. The same lookup as a GPU process's."""
    found = {}
    for position, event in enumerate(events):
        if event.kind == "xid" and event.pid is not None:
            process = Process(pid=event.pid, used_memory=None, kind="compute", name=event.process_name,
                              container_id=event.container_id, pod_uid=event.pod_uid, slurm=event.slurm)
            holder = directory.for_process(process)
            if holder is not None:
                found[position] = holder
    return found
