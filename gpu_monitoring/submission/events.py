"""XIDs: a count per device and code, and one Datadog event each with what to do."""

from collections import Counter
from typing import Dict, List, Optional

from datadog_checks.base import AgentCheck

from .. import xid
from ..snapshot import Device, Event, Snapshot

_ALERT = {"critical": "error", "warning": "warning", "ok": "info"}


def submit_xids(check: AgentCheck, snapshot: Snapshot, tags_by_uuid: Dict[str, List[str]], base: List[str]) -> None:
    counts: Counter = Counter()
    for event in snapshot.events:
        if event.kind != "xid":
            continue
        info = xid.describe(event.code)
        device = snapshot.device_of(event)
        tags = _tags(event, device, tags_by_uuid, base)
        xid_tags = tags + [f"xid:{event.code}", f"xid_origin:{info.origin}", f"xid_action:{info.action}"]
        counts[tuple(xid_tags)] += 1
        check.event(_event(event, info, device, xid_tags))
    for xid_tags, count in counts.items():
        check.count("xid_errors", count, tags=list(xid_tags))


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


def _event(event: Event, info: xid.Xid, device: Optional[Device], tags: List[str]) -> dict:
    where = _where(event, device)
    instance = f", GPU instance {event.gpu_instance_id}" if event.gpu_instance_id is not None else ""
    uuid = f", UUID {event.device_uuid}" if event.device_uuid else ""
    return {
        "timestamp": int(event.timestamp),
        "event_type": "gpu_monitoring.xid",
        "source_type_name": "gpu_monitoring",
        "msg_title": f"XID {event.code} on {where}: {info.meaning}",
        "msg_text": (
            f"NVIDIA XID {event.code} ({info.meaning}, origin: {info.origin}) on {where}{instance}{uuid}.\n\n"
            f"What to do: {info.advice}"
        ),
        "alert_type": _ALERT[info.severity],
        "aggregation_key": f"gpu_monitoring.xid.{event.device_uuid}",
        "tags": tags,
    }
