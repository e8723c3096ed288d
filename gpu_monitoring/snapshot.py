"""The Snapshot: what one collection saw on a node, as plain, versioned, JSON-able data.

Collectors fill it; attribution and submission read it. Local mode passes it in memory,
sidecar mode as JSON (`to_json` / `from_json`). What comes as JSON is checked field by field
against the types below where it enters (`from_dict`), so that a wrong document is one clear
error there rather than a TypeError deep in attribution or submission.
"""

import dataclasses
import functools
import json
import math
import re
import typing
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

SCHEMA_VERSION = 1
# The kinds the NVML layer names, and `type_0x...` for an event type it has no name for.
EVENT_KIND = re.compile(r"xid|ecc_sbe|ecc_dbe|recovery_action|gpu_unavailable|type_0x[0-9a-f]+"
                        # and what the kernel's log tells (node.kernel_patterns)
                        r"|gpu_uuid|init_failed|sxid|nic|aer|driver_loaded")
# Who told of an event: NVML's event set, or the kernel's log.
EVENT_SOURCE = re.compile(r"nvml|kernel")
PROCESS_KIND = re.compile(r"compute|mps")
ALLOCATIONS_SOURCE = re.compile(r"pod_resources|none|error")
SERVICE_CHECK_STATUS = re.compile(r"ok|warning|critical")
# What an NVIDIA PCI function is, by its class (node.pci): a GPU, an NVSwitch, an HDMI audio function.
PCI_KIND = re.compile(r"gpu|nvswitch|audio|other")


def _pattern(regex: "re.Pattern[str]", **options: Any) -> Any:
    """A field whose text, read from JSON, must match `regex` whole."""
    return field(metadata={"pattern": regex}, **options)


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
    kind: str = _pattern(PROCESS_KIND)
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
    # The host's path of the cgroup of the process's workload (its container's, or its Slurm job's),
    # relative to the cgroup mount; None for the host's own processes or where it cannot be read.
    cgroup: Optional[str] = None
    # The process's state letter in `/proc/<pid>/stat` this run (R, S, D, Z...), where it was read.
    state: Optional[str] = None

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "Process":
        """`slurm` came after version 1: a snapshot without it still loads."""
        return load(cls, raw, "process")


@dataclass(frozen=True)
class Allocation:
    """A device (or MIG instance, or shared replica) the kubelet gave a container, as pod-resources lists it."""

    namespace: str
    pod: str
    container: str
    # A device plugin's resource (`nvidia.com/gpu`), or for a DRA claim its driver (`gpu.nvidia.com`).
    resource_name: str
    # A device plugin's device ID, or the device name a DRA driver gave the claim (`gpu-0`).
    device_id: str
    # DRA only (pod-resources `DynamicResource` / `ClaimResource`); absent for device plugins.
    claim_name: Optional[str] = None
    claim_namespace: Optional[str] = None
    pool: Optional[str] = None
    share_id: Optional[str] = None

    @property
    def dynamic(self) -> bool:
        """Allocated through a DRA claim rather than a device plugin."""
        return self.claim_name is not None


@dataclass(frozen=True)
class Advertised:
    """A device ID a device plugin advertises to the kubelet, free or held: every replica of a shared GPU."""

    resource_name: str
    device_id: str


@dataclass
class Event:
    """An NVML event, with the GPU as NVML named it when the GPU was registered for events: its UUID,
    index and PCI bus ID stay known after the GPU is lost. Index and bus ID came after version 1.

    Or a message of the kernel's log (`source` "kernel", node.kernel_events): an XID with the process
    the driver named and, where that process was alive when the line was read, its owner; or what NVML
    never tells (a GPU the driver could not initialise, an NVSwitch SXid, a ConnectX error, PCIe AER).
    `pci_bus_id` is then the PCI function the message names, in NVML's form; `reporter` the port that
    reported an AER error; `boot_id` and `kernel_seq` where the record stands in the kernel's log.
    Every field after `pci_bus_id` came after version 1."""

    device_uuid: Optional[str]
    kind: str = _pattern(EVENT_KIND)
    code: int
    timestamp: float
    gpu_instance_id: Optional[int] = None
    compute_instance_id: Optional[int] = None
    device_index: Optional[int] = None
    pci_bus_id: Optional[str] = None
    source: str = _pattern(EVENT_SOURCE, default="nvml")
    pid: Optional[int] = None
    process_name: Optional[str] = None
    container_id: Optional[str] = None
    pod_uid: Optional[str] = None
    slurm: Optional[SlurmJob] = None
    detail: Optional[str] = None
    severity: Optional[str] = None
    link: Optional[int] = None
    implied: bool = False
    reporter: Optional[str] = None
    boot_id: Optional[str] = None
    kernel_seq: Optional[int] = None


@dataclass
class MigInstance:
    uuid: str
    gpu_instance_id: Optional[int]
    compute_instance_id: Optional[int]
    profile: Optional[str]
    metrics: Dict[str, float] = field(default_factory=dict)
    # The GPU instance's profile ID and placement (start and size in memory slices), as NVML's
    # nvmlGpuInstanceGetInfo gives them: NVIDIA's DRA driver names a MIG device by them.
    gpu_instance_profile_id: Optional[int] = None
    placement_start: Optional[int] = None
    placement_size: Optional[int] = None
    # Series of a part of the instance, by that part's tags joined with commas, then by metric name.
    tagged_metrics: Dict[str, Dict[str, float]] = field(default_factory=dict)
    processes: List[Process] = field(default_factory=list)
    # Who measured the SM and engine activity (`sm_active`, `graphics_active`...): "gpm" (NVML, Hopper
    # and later) or "dcgm" (the node's dcgm-exporter); None where neither did.
    activity_source: Optional[str] = None


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
    # Series of a part of the GPU (an NVLink link), by that part's tags joined with commas, then by metric name.
    tagged_metrics: Dict[str, Dict[str, float]] = field(default_factory=dict)
    processes: List[Process] = field(default_factory=list)
    # Who measured the SM and engine activity (`sm_active`, `graphics_active`...): "gpm" (NVML, Hopper
    # and later) or "dcgm" (the node's dcgm-exporter); None where neither did.
    activity_source: Optional[str] = None
    mig_instances: List[MigInstance] = field(default_factory=list)
    # Each NVLink link's state (NVML_FI_DEV_NVLINK_GET_STATE) in link order; None where the driver
    # did not answer. Health judges it in every metrics profile.
    nvlink_states: List[Optional[int]] = field(default_factory=list)
    unsupported: List[str] = field(default_factory=list)
    # The NVLink fabric (NVSwitch) the GPU is registered with: its clique and cluster, which group a
    # rack's GPUs; NVML's words for a failed registration; values NVML gave outside its own enums,
    # not trusted. The driver's recovery action (nvmlDeviceGpuRecoveryAction_t); C2C links down.
    # All came after version 1.
    fabric_clique_id: Optional[int] = None
    fabric_cluster_uuid: Optional[str] = None
    fabric_error: Optional[str] = None
    fabric_untrusted: List[str] = field(default_factory=list)
    recovery_action: Optional[int] = None
    c2c_down: List[int] = field(default_factory=list)
    # Inventory, for drift across a fleet (not health): the VBIOS version and whether persistence
    # mode is on. Both came after version 1.
    vbios_version: Optional[str] = None
    persistence_mode: Optional[bool] = None


@dataclass
class PciFunction:
    """An NVIDIA (vendor 0x10de) PCI function as the kernel's sysfs shows it (node.pci)."""

    address: str  # the sysfs name: domain:bus:device.function, lower case (0000:c1:00.0)
    class_code: int  # 0x030200: a 3D controller
    kind: str = _pattern(PCI_KIND)
    device_id: Optional[int] = None
    # The kernel driver bound to it (`nvidia`, `vfio-pci`, `snd_hda_intel`); None where none is.
    driver: Optional[str] = None
    # The PCI bridge (the port) directly above it: an AER error that port reports is this link's.
    parent: Optional[str] = None
    # The PCIe AER errors the kernel counted for it since boot (`aer_dev_*`'s totals), by severity:
    # corrected, nonfatal, fatal. None where the kernel has no such files (before Linux 5.1, or AER off).
    aer: Optional[Dict[str, int]] = None


@dataclass
class NetworkPort:
    """One InfiniBand or RoCE port of an RDMA device as sysfs shows it (node.infiniband):
    `class/infiniband/<device>/ports/<port>/`. A file the kernel did not give is None or left out."""

    device: str  # mlx5_0
    port: int
    state: Optional[str] = None  # the logical state's name: DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER
    phys_state: Optional[str] = None  # the physical state's name: Sleep, Polling, Disabled, LinkUp...
    rate_gbps: Optional[float] = None
    link_layer: Optional[str] = None  # InfiniBand or Ethernet (RoCE)
    netdev: Optional[str] = None  # the port's network interface, where the kernel shows it
    # The counters/ files read, by file name, as the kernel gives them: port_rcv_data and
    # port_xmit_data count 4-byte words.
    counters: Dict[str, int] = field(default_factory=dict)
    # The PCI function of its NIC, its parent port and AER totals, as for a PCI function (above).
    pci_address: Optional[str] = None
    parent: Optional[str] = None
    aer: Optional[Dict[str, int]] = None


@dataclass
class CgroupUse:
    """What a workload's cgroup showed between the last run and this one (node.cgroups): the share of
    its CPU periods that were throttled (%), the CPU it used (cores), its CPU quota (cores; None when
    unbounded), and PSI's `some avg10` for IO and memory (%; None on cgroup v1 or where PSI is off)."""

    version: int
    throttled: Optional[float] = None
    usage_cores: Optional[float] = None
    quota_cores: Optional[float] = None
    io_pressure: Optional[float] = None
    memory_pressure: Optional[float] = None


@dataclass(frozen=True)
class SlurmAllocation:
    """A Slurm job running on this node and the GPUs Slurm gave it, by NVML minor number (node.slurm_jobs),
    whether or not any of its processes runs on them."""

    job: SlurmJob
    gpu_minors: List[int] = field(default_factory=list)


@dataclass
class Node:
    driver_version: Optional[str] = None
    nvml_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None
    # What NVML reads but cannot give this run (permission, events not watched): the check says it.
    problems: List[str] = field(default_factory=list)
    # The node around the GPUs, all after version 1. The kernel's boot ID (a reboot changes it);
    # the NVIDIA PCI functions under sysfs_root; the PCI bus IDs in the driver's own record of its
    # GPUs; the InfiniBand and RoCE ports. None where that could not be read at all (no sysfs
    # there, no driver directory, no class/infiniband), which is not the same as an empty list.
    boot_id: Optional[str] = None
    pci_functions: Optional[List[PciFunction]] = None
    driver_gpus: Optional[List[str]] = None
    network_ports: Optional[List[NetworkPort]] = None
    # Why sysfs_root could not be read, where it could not.
    sysfs_problem: Optional[str] = None
    # Why the kernel's log cannot be read (kernel_log), where it cannot.
    kernel_log_problem: Optional[str] = None
    # When the node around the GPUs was read, in seconds on the clock its counters follow (the host's;
    # a simulated node's own): the ports' rates are taken over it.
    read_at: Optional[float] = None
    # The cgroups of the workloads running GPU processes, by host path (Process.cgroup); None where
    # the host's cgroup tree cannot be read. The host's CPU cores, for a workload with no CPU quota.
    cgroups: Optional[Dict[str, CgroupUse]] = None
    cpu_cores: Optional[int] = None
    # The Slurm jobs on the node with the GPUs each was given; None on a node without Slurm.
    slurm_allocations: Optional[List[SlurmAllocation]] = None


@dataclass
class Allocations:
    """What pod-resources said this run: the allocations, or why there are none to trust."""

    # pod_resources | none (not on Kubernetes or not configured) | error
    source: str = _pattern(ALLOCATIONS_SOURCE, default="none")
    error: Optional[str] = None
    items: List[Allocation] = field(default_factory=list)
    # What the device plugins advertise (GetAllocatableResources); None when the kubelet does not
    # say (before 1.23, or the call failed), and advertised_error then says why.
    advertised: Optional[List[Advertised]] = None
    advertised_error: Optional[str] = None

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "Allocations":
        """Fields added since version 1 are optional, so that a check reads an older sidecar's snapshot."""
        return load(cls, raw, "allocations")


@dataclass
class DcgmRead:
    """How the sidecar's read of the node's dcgm-exporter went: the `dcgm.can_connect` status it
    deserves (ok|warning|critical) and why."""

    status: str = _pattern(SERVICE_CHECK_STATUS)
    reason: Optional[str] = None


@dataclass
class Snapshot:
    timestamp: float
    node: Node
    devices: List[Device] = field(default_factory=list)
    events: List[Event] = field(default_factory=list)
    allocations: Allocations = field(default_factory=Allocations)
    version: int = SCHEMA_VERSION
    # Where the sidecar read dcgm-exporter (its --dcgm-exporter-url) and put its activity into the
    # devices: the check then reads it no more. None where it did not, or is older than this field.
    dcgm_read: Optional[DcgmRead] = None

    def device_of(self, event: Event) -> Optional[Device]:
        """The GPU an event is about: the one with its UUID; else, among GPUs this snapshot could not name
        (or for an event that names none), the one at its PCI bus ID, or its index where either lacks one."""
        if event.device_uuid is not None:
            for device in self.devices:
                if device.uuid == event.device_uuid:
                    return device
        for device in self.devices:
            if device.uuid is not None and event.device_uuid is not None:
                continue  # another GPU, named otherwise
            if device.pci_bus_id and event.pci_bus_id:
                if device.pci_bus_id.lower() == event.pci_bus_id.lower():
                    return device
            elif event.device_index is not None and device.index == event.device_index:
                return device
        return None

    def identify_from_events(self) -> None:
        """A GPU this collection could not name (lost before anything read it) takes the UUID and PCI bus
        ID its events carry, so that its health and series are tagged as its events are."""
        for event in self.events:
            device = self.device_of(event)
            if device is not None and device.uuid is None:
                device.uuid = event.device_uuid
                device.pci_bus_id = device.pci_bus_id or event.pci_bus_id

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, text: str) -> "Snapshot":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, raw: Any) -> "Snapshot":
        """The snapshot a JSON object describes; ValueError, naming the first wrong field, when it does not."""
        if not isinstance(raw, dict):
            raise ValueError(f"the snapshot is {_json_type(raw)}, not an object")
        if raw.get("version") != SCHEMA_VERSION:
            raise ValueError(f"snapshot version {raw.get('version')!r}, expected {SCHEMA_VERSION}")
        return load(cls, raw, "snapshot")


T = typing.TypeVar("T")


@functools.cache
def _hints(cls: type) -> Dict[str, Any]:
    # Resolving hints evaluates their strings: once per class, not once per object of every snapshot.
    return typing.get_type_hints(cls)


def load(cls: typing.Type[T], raw: Any, where: str) -> T:
    """The dataclass `cls` from a JSON object, each field checked against its type hint (and pattern);
    ValueError naming the first wrong field. A field `cls` has a default for may be absent (it came
    after the sender's version); a key `cls` does not know is ignored (it came after ours)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} is {_json_type(raw)}, not an object")
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in raw:
            values[f.name] = _checked(hints[f.name], raw[f.name], f"{where}.{f.name}", f.metadata.get("pattern"))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{where} has no `{f.name}`")
    return cls(**values)


def _checked(hint: Any, value: Any, where: str, pattern: Optional["re.Pattern[str]"] = None) -> Any:
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        return _checked(next(a for a in arguments if a is not type(None)), value, where, pattern)
    if origin is list:
        return [_checked(arguments[0], item, f"{where}[{i}]") for i, item in enumerate(json_typed(list, value, where))]
    if origin is dict:
        return {json_typed(str, k, f"{where} key"): _checked(arguments[1], v, f"{where}[{k!r}]")
                for k, v in json_typed(dict, value, where).items()}
    if dataclasses.is_dataclass(hint):
        return load(hint, value, where)
    value = json_typed((int, float) if hint is float else hint, value, where)
    # JSON has no NaN or infinity; Python's json writes and reads them. No reading is either.
    if hint is float and not math.isfinite(value):
        raise ValueError(f"{where} is {value}, not a finite number")
    if pattern is not None and not pattern.fullmatch(value):
        raise ValueError(f"{where} {value!r} is not one this check knows ({pattern.pattern})")
    return value


def json_typed(kind: Any, value: Any, where: str) -> Any:
    """`value`, read from JSON, when it is a `kind` (a type or a tuple of types); ValueError naming `where`
    otherwise. bool is an int to Python, never to JSON."""
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # A float field takes integers too: say "a number" for both.
        expected = " or ".join(_JSON_TYPES[k] for k in kinds if not (k is int and float in kinds))
        raise ValueError(f"{where} is {_json_type(value)}, not {expected}")
    return value


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
               bool: "a boolean", type(None): "null"}


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)
