"""XIDs: an exact count per GPU and code, and one Datadog event per GPU, code and run with what to do.

A storm (one bad job raising thousands of XIDs) is one event with its count; a run with XIDs of more
GPU and code groups than MAX_EVENTS sends the most severe groups' events and one more that tells how
much it left out. The work is one pass over the run's events, then a little per group.
"""

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Dict, List, NamedTuple, Optional, Set, Tuple

from datadog_checks.base import AgentCheck

from gpu_monitoring.attribution.holders import Holder
from gpu_monitoring.health import xid
from gpu_monitoring.metrics.names import FABRIC_STATE, XID_ERRORS
from gpu_monitoring.snapshot import Device, Event, Snapshot
from gpu_monitoring.submission.tags import merge

_ALERT = {"critical": "error", "warning": "warning", "ok": "info"}
_RANK = {"critical": 0, "warning": 1, "ok": 2}
# Datadog events one run sends for XIDs, the note of what was left out aside.
MAX_EVENTS = 50
EVENT_TYPE = "gpu_monitoring.health.xid"

# Processes of an owner, and owners, an event's title names at most: a storm from many ranks names a few.
MAX_PROCESSES_NAMED = 4
MAX_OWNERS_NAMED = 2


@dataclass
class _Owner:
    """Whose process some of a group's XIDs hit, as far as the kernel's log named it."""

    holder: Optional[Holder]
    name: Optional[str]  # the process's name, where no owner is known
    count: int = 0
    processes: Dict[int, Optional[str]] = field(default_factory=dict)  # pid: name, as the kernel named them


@dataclass
class _Group:
    """The XIDs of one code on one GPU in this run, by whose process they hit where the driver named it."""

    event: Event  # the first: names the GPU
    count: int = 0
    first: float = float("inf")
    last: float = float("-inf")
    instances: Set[int] = field(default_factory=set)
    owners: Dict[tuple, _Owner] = field(default_factory=dict)
    kernel_only: bool = True  # NVML raised no event for any of them

    def add(self, event: Event, holder: Optional[Holder]) -> None:
        self.count += 1
        self.first = min(self.first, event.timestamp)
        self.last = max(self.last, event.timestamp)
        if event.gpu_instance_id is not None:
            self.instances.add(event.gpu_instance_id)
        key = holder.key if holder is not None else ("process", event.process_name)
        owner = self.owners.get(key)
        if owner is None:
            owner = self.owners[key] = _Owner(holder, event.process_name if holder is None else None)
        owner.count += 1
        if event.pid is not None and len(owner.processes) < MAX_PROCESSES_NAMED:
            owner.processes.setdefault(event.pid, event.process_name)
        self.kernel_only = self.kernel_only and event.source == "kernel"


class _Judged(NamedTuple):
    group: _Group
    info: xid.Xid  # as it applies to this GPU in this run (xid.in_context)
    device: Optional[Device]
    tags: List[str]


def submit_xids(check: AgentCheck, snapshot: Snapshot, tags_by_uuid: Dict[str, List[str]], base: List[str],
                holders: Optional[Dict[int, Holder]] = None,
                holder_tags: Callable[[Holder], List[str]] = lambda _: []) -> None:
    """`holders` are the owners of the processes XIDs hit, by the event's position (attribution.event_owners):
    their XIDs are counted apart, with the owner's tags, and named in their GPU's event."""
    judged = _judge(snapshot, _groups(snapshot, holders or {}), tags_by_uuid, base)
    counts: Counter = Counter()
    for one in judged:
        for owner in one.group.owners.values():
            counts[tuple(merge(one.tags, _owner_tags(owner, holder_tags)))] += owner.count
    for xid_tags, count in counts.items():
        check.count(XID_ERRORS, count, tags=list(xid_tags))
    judged.sort(key=lambda one: _RANK[one.info.severity])  # stable: most severe first, then as they came
    for one in judged[:MAX_EVENTS]:
        check.event(_event(one))
    if len(judged) > MAX_EVENTS:
        check.event(_left_out(judged[MAX_EVENTS:], len(judged), base))


def _judge(snapshot: Snapshot, groups: Dict[Tuple[tuple, int], _Group], tags_by_uuid: Dict[str, List[str]],
           base: List[str]) -> List[_Judged]:
    """Each group with what its code asks for on its GPU and the tags its count and event carry."""
    codes: Dict[tuple, Set[int]] = {}
    for gpu, code in groups:
        codes.setdefault(gpu, set()).add(code)
    judged = []
    for (gpu, code), group in groups.items():
        device = snapshot.device_of(group.event)
        info = xid.in_context(code, codes[gpu], device is not None and FABRIC_STATE in device.metrics)
        tags = _tags(group.event, device, tags_by_uuid, base)
        judged.append(_Judged(group, info, device, tags + [
            f"xid:{code}", f"xid_origin:{info.origin}", f"xid_action:{info.action}"]))
    return judged


def _groups(snapshot: Snapshot, holders: Dict[int, Holder]) -> Dict[Tuple[tuple, int], _Group]:
    """The run's XIDs by GPU and code, in the order each group first came. The GPU is the snapshot's that
    an event names (NVML's event and the kernel's line name it each their own way), else as the event does."""
    groups: Dict[Tuple[tuple, int], _Group] = {}
    for position, event in enumerate(snapshot.events):
        if event.kind != "xid":
            continue
        device = snapshot.device_of(event)
        gpu = ("index", device.index) if device is not None else (event.device_uuid, event.device_index,
                                                                    event.pci_bus_id)
        group = groups.get((gpu, event.code))
        if group is None:
            group = groups[(gpu, event.code)] = _Group(event)
        group.add(event, holders.get(position))
    return groups


def _owner_tags(owner: _Owner, holder_tags: Callable[[Holder], List[str]]) -> List[str]:
    """The owner's tags; where the process is gone (or its owner unknown), the name the kernel gave it."""
    if owner.holder is not None:
        return holder_tags(owner.holder)
    return [f"process_name:{owner.name}"] if owner.name else []


def _owners(group: _Group) -> str:
    """` — pod ml/train-3 (python, pid 4711)`: whose processes the XIDs hit, where the driver named them."""
    named = [_who(owner) for owner in group.owners.values() if owner.processes]
    if not named:
        return ""
    more = f" and {len(named) - MAX_OWNERS_NAMED} more" if len(named) > MAX_OWNERS_NAMED else ""
    return " — " + ", ".join(named[:MAX_OWNERS_NAMED]) + more


def _who(owner: _Owner) -> str:
    processes = ", ".join(f"{name}, pid {pid}" if name else f"pid {pid}" for pid, name in owner.processes.items())
    holder = owner.holder
    if holder is None:
        return processes
    if holder.slurm is not None:
        who = f"Slurm job {holder.slurm.job_id}"
    elif holder.pod:
        who = f"pod {holder.namespace}/{holder.pod}"
    else:
        who = f"container {(holder.container_id or '')[:12]}"
    return f"{who} ({processes})"


def _tags(event: Event, device: Optional[Device], tags_by_uuid: Dict[str, List[str]], base: List[str]) -> List[str]:
    """The GPU's own tags; for a GPU this snapshot has no UUID for, or none at all, the GPU as the event names it."""
    if device is not None and device.uuid is not None and device.uuid in tags_by_uuid:
        return tags_by_uuid[device.uuid]
    named = {"gpu_uuid": event.device_uuid, "gpu_index": event.device_index, "gpu_pci_bus_id": event.pci_bus_id}
    return base + [f"{key}:{str(value).lower()}" for key, value in named.items() if value is not None]


def _where(event: Event, device: Optional[Device]) -> str:
    if device is not None:
        return f"GPU {device.index}" + (f" ({device.name})" if device.name else "")
    if event.device_index is not None:
        return f"GPU {event.device_index}"
    return f"GPU {event.device_uuid}" if event.device_uuid else "an unknown GPU"


def _event(judged: _Judged) -> dict:
    group, info = judged.group, judged.info
    event = group.event
    where = _where(event, judged.device)
    instances = ", ".join(map(str, sorted(group.instances)))
    instance = f", GPU instance{'s' if len(group.instances) > 1 else ''} {instances}" if instances else ""
    uuid = f", UUID {event.device_uuid}" if event.device_uuid else ""
    gpu = event.device_uuid or event.pci_bus_id or event.device_index
    return {
        "timestamp": int(group.first),
        "event_type": EVENT_TYPE,
        "source_type_name": "gpu_monitoring",
        "msg_title": f"{xid.label(event.code, group.count)} on {where}: {info.meaning}{_owners(group)}",
        "msg_text": (
            f"NVIDIA XID {event.code} ({info.meaning}, origin: {info.origin}) on {where}{instance}{uuid}"
            f"{_when(group)}.{_told(group)}\n\nWhat to do: {info.advice}"
        ),
        "alert_type": _ALERT[info.severity],
        "aggregation_key": f"{EVENT_TYPE}.{gpu}.{event.code}",
        "tags": judged.tags,
    }


def _told(group: _Group) -> str:
    """What the driver said of it, and where only the kernel's log told of it, that NVML raised no event."""
    detail = f" The driver said: {group.event.detail}." if group.event.detail else ""
    if group.kernel_only:
        return f"{detail} From the kernel's record: NVML raised no event for it (nothing listened then)."
    return detail


def _when(group: _Group) -> str:
    """When many came, from the first to the last; one is said by the event's own timestamp."""
    if group.count == 1:
        return ""
    return f", {group.count:,} times from {_time(group.first)} to {_time(group.last)}"


def _time(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _left_out(left: List[_Judged], groups: int, base: List[str]) -> dict:
    """The one event that tells of the groups past MAX_EVENTS."""
    xids = sum(one.group.count for one in left)
    worst = min((one.info.severity for one in left), key=_RANK.__getitem__)
    return {
        "timestamp": int(min(one.group.first for one in left)),
        "event_type": EVENT_TYPE,
        "source_type_name": "gpu_monitoring",
        "msg_title": f"{len(left):,} more GPU and XID code groups ({xids:,} XIDs) left out of this run's events",
        "msg_text": (
            f"XIDs of {groups:,} GPU and code groups came in one run; events were sent for the "
            f"{MAX_EVENTS} most severe. The other {len(left):,} groups ({xids:,} XIDs) have none: "
            "gpu_monitoring.xid_errors counts every XID, by GPU and code."
        ),
        "alert_type": _ALERT[worst],
        "aggregation_key": f"{EVENT_TYPE}.left_out",
        "tags": base,
    }
