"""What can be held on a node: each GPU, or each MIG instance of a GPU in MIG mode, with the processes on it."""

from dataclasses import dataclass
from typing import List, Optional, Tuple

from gpu_monitoring.snapshot import Device, MigInstance, Process, Snapshot

TargetKey = Tuple[int, Optional[str]]  # (GPU index, MIG instance UUID or None)


@dataclass
class Target:
    key: TargetKey
    device: Device
    instance: Optional[MigInstance]
    processes: List[Process]


def targets(snapshot: Snapshot) -> List[Target]:
    """Every target of the node, GPU by GPU; a MIG parent is no target of its own, its instances are."""
    found = []
    for device in snapshot.devices:
        if device.mig_instances:
            found += [Target((device.index, m.uuid), device, m, m.processes) for m in device.mig_instances]
        else:
            found.append(Target((device.index, None), device, None, device.processes))
    return found


def is_mps_server(process: Process) -> bool:
    return (process.name or "").startswith("nvidia-cuda-mps")
