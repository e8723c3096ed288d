"""The Snapshot: what one collection saw on a node, as plain, versioned, JSON-able data.

Collectors fill it; attribution and submission read it. Local mode passes it in memory,
sidecar mode as JSON (`to_json` / `from_json`).
"""

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm job step a process runs in. The job and step come from its cgroup; the UID from
    the cgroup v1 path or else the process's real UID; name, partition, account and user from its
    environment, only where that is readable."""

    job_id: str
    step: Optional[str] = None
    uid: Optional[int] = None
    name: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    user: Optional[str] = None


@dataclass
class Process:
    pid: int
    used_memory: Optional[int]
    kind: str  # compute | mps
    gpu_instance_id: Optional[int] = None
    compute_instance_id: Optional[int] = None
    name: Optional[str] = None
    container_id: Optional[str] = None
    pod_uid: Optional[str] = None
    sm_utilization: Optional[float] = None
    memory_utilization: Optional[float] = None
    encoder_utilization: Optional[float] = None
    decoder_utilization: Optional[float] = None
    slurm: Optional[SlurmJob] = None

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "Process":
        """`slurm` came after version 1: a snapshot without it still loads."""
        slurm = raw.get("slurm")
        return cls(**dict(raw, slurm=SlurmJob(**slurm) if slurm else None))


@dataclass
class Allocation:
    """A device (or MIG instance, or shared replica) the kubelet gave a container, as pod-resources lists it."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_id: str


@dataclass
class Advertised:
    """A device ID a device plugin advertises to the kubelet, free or held: every replica of a shared GPU."""

    resource_name: str
    device_id: str


@dataclass
class Event:
    device_uuid: Optional[str]
    kind: str  # xid | ecc_sbe | ecc_dbe
    code: int
    timestamp: float
    gpu_instance_id: Optional[int] = None
    compute_instance_id: Optional[int] = None


@dataclass
class MigInstance:
    uuid: str
    gpu_instance_id: Optional[int]
    compute_instance_id: Optional[int]
    profile: Optional[str]
    metrics: Dict[str, float] = field(default_factory=dict)
    processes: List[Process] = field(default_factory=list)


@dataclass
class Device:
    index: int
    uuid: Optional[str]
    name: Optional[str] = None
    architecture: Optional[str] = None
    pci_bus_id: Optional[str] = None
    minor_number: Optional[int] = None
    mig_enabled: Optional[bool] = None
    lost: bool = False
    error: Optional[str] = None
    metrics: Dict[str, float] = field(default_factory=dict)
    processes: List[Process] = field(default_factory=list)
    mig_instances: List[MigInstance] = field(default_factory=list)
    nvlink_down: List[int] = field(default_factory=list)
    unsupported: List[str] = field(default_factory=list)


@dataclass
class Node:
    driver_version: Optional[str] = None
    nvml_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None


@dataclass
class Allocations:
    """What pod-resources said this run: the allocations, or why there are none to trust."""

    source: str = "none"  # pod_resources | none (not on Kubernetes or not configured) | error
    error: Optional[str] = None
    items: List[Allocation] = field(default_factory=list)
    # What the device plugins advertise (GetAllocatableResources); None when the kubelet does not
    # say (before 1.23, or the call failed), and advertised_error then says why.
    advertised: Optional[List[Advertised]] = None
    advertised_error: Optional[str] = None

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "Allocations":
        """Fields added since version 1 are optional, so that a check reads an older sidecar's snapshot."""
        advertised = raw.get("advertised")
        return cls(
            source=raw["source"],
            error=raw.get("error"),
            items=[Allocation(**a) for a in raw["items"]],
            advertised=None if advertised is None else [Advertised(**a) for a in advertised],
            advertised_error=raw.get("advertised_error"),
        )


@dataclass
class Snapshot:
    timestamp: float
    node: Node
    devices: List[Device] = field(default_factory=list)
    events: List[Event] = field(default_factory=list)
    allocations: Allocations = field(default_factory=Allocations)
    version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, text: str) -> "Snapshot":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "Snapshot":
        """The snapshot a JSON object describes; ValueError (or KeyError/TypeError) when it does not."""
        if raw.get("version") != SCHEMA_VERSION:
            raise ValueError(f"snapshot version {raw.get('version')!r}, expected {SCHEMA_VERSION}")
        return cls(
            timestamp=raw["timestamp"],
            node=Node(**raw["node"]),
            devices=[_device(d) for d in raw["devices"]],
            events=[Event(**e) for e in raw["events"]],
            allocations=Allocations.from_dict(raw["allocations"]),
        )


def _device(raw: Dict[str, Any]) -> Device:
    raw = dict(raw)
    raw["processes"] = [Process.from_dict(p) for p in raw["processes"]]
    raw["mig_instances"] = [
        MigInstance(**dict(m, processes=[Process.from_dict(p) for p in m["processes"]])) for m in raw["mig_instances"]
    ]
    return Device(**raw)
