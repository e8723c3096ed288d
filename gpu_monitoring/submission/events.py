"""XIDs: an exact count per GPU and code, and one Datadog event per GPU, code and run with what to do.

A storm (one bad job raising thousands of XIDs) is one event with its count; a run with XIDs of more
GPU and code groups than MAX_EVENTS sends the most severe groups' events and one more that tells how
much it left out. The work is one pass over the run's events, then a little per group.
"""

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

from datadog_checks.base import AgentCheck

from gpu_monitoring.health import xid
from gpu_monitoring.metrics.names import FABRIC_STATE, XID_ERRORS
from gpu_monitoring.snapshot import Device, Event, Snapshot

_ALERT = {"critical": "error", "warning": "warning", "ok": "info"}
_RANK = {"critical": 0, "warning": 1, "ok": 2}
# Datadog events one run sends for XIDs, the note of what was left out aside.
MAX_EVENTS = 50
EVENT_TYPE = "gpu_monitoring.health.xid"

GpuKey = Tuple[Optional[str], Optional[int], Optional[str]]  # the GPU as an event names it


@dataclass
class _Group:
    """The XIDs of one code on one GPU in this run."""

    event: Event  # the first: names the GPU
    count: int = 0
    first: float = float("inf")
    last: float = float("-inf")
    instances: Set[int] = field(default_factory=set)

    def add(self, event: Event) -> None:
        self.count += 1
        self.first = min(self.first, event.timestamp)
        self.last = max(self.last, event.timestamp)
        if event.gpu_instance_id is not None:
            self.instances.add(event.gpu_instance_id)


class _Judged(NamedTuple):
    group: _Group
    info: xid.Xid  # as it applies to this GPU in this run (xid.in_context)
    device: Optional[Device]
    tags: List[str]


def submit_xids(check: AgentCheck, snapshot: Snapshot, tags_by_uuid: Dict[str, List[str]], base: List[str]) -> None:
    judged = _judge(snapshot, _groups(snapshot.events), tags_by_uuid, base)
    counts: Counter = Counter()
    for one in judged:
        counts[tuple(one.tags)] += one.group.count
    for xid_tags, count in counts.items():
        check.count(XID_ERRORS, count, tags=list(xid_tags))
    judged.sort(key=lambda one: _RANK[one.info.severity])  # stable: most severe first, then as they came
    for one in judged[:MAX_EVENTS]:
        check.event(_event(one))
    if len(judged) > MAX_EVENTS:
        check.event(_left_out(judged[MAX_EVENTS:], len(judged), base))


def _judge(snapshot: Snapshot, groups: Dict[Tuple[GpuKey, int], _Group], tags_by_uuid: Dict[str, List[str]],
           base: List[str]) -> List[_Judged]:
    """Each group with what its code asks for on its GPU and the tags its count and event carry."""
    codes: Dict[GpuKey, Set[int]] = {}
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


def _groups(events: List[Event]) -> Dict[Tuple[GpuKey, int], _Group]:
    """The run's XIDs by GPU and code, in the order each group first came."""
    groups: Dict[Tuple[GpuKey, int], _Group] = {}
    for event in events:
        if event.kind != "xid":
            continue
        key = ((event.device_uuid, event.device_index, event.pci_bus_id), event.code)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(event)
        group.add(event)
    return groups


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
        "msg_title": f"{xid.label(event.code, group.count)} on {where}: {info.meaning}",
        "msg_text": (
            f"NVIDIA XID {event.code} ({info.meaning}, origin: {info.origin}) on {where}{instance}{uuid}"
            f"{_when(group)}.\n\nWhat to do: {info.advice}"
        ),
        "alert_type": _ALERT[info.severity],
        "aggregation_key": f"{EVENT_TYPE}.{gpu}.{event.code}",
        "tags": judged.tags,
    }


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
