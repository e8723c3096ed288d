"""XIDs: a count per device and code, and one Datadog event each with what to do."""

from collections import Counter
from typing import Dict, List, Optional

from datadog_checks.base import AgentCheck

from .. import xid
from ..snapshot import Device, Event, Snapshot

_ALERT = {"critical": "error", "warning": "warning", "ok": "info"}


def submit_xids(check: AgentCheck, snapshot: Snapshot, tags_by_uuid: Dict[str, List[str]], base: List[str]) -> None:
    devices = {d.uuid: d for d in snapshot.devices}
    counts: Counter = Counter()
    for event in snapshot.events:
        if event.kind != "xid":
            continue
        info = xid.describe(event.code)
        tags = tags_by_uuid.get(event.device_uuid, base)
        xid_tags = tags + [f"xid:{event.code}", f"xid_origin:{info.origin}", f"xid_action:{info.action}"]
        counts[tuple(xid_tags)] += 1
        check.event(_event(event, info, devices.get(event.device_uuid), xid_tags))
    for xid_tags, count in counts.items():
        check.count("xid_errors", count, tags=list(xid_tags))


def _event(event: Event, info: xid.Xid, device: Optional[Device], tags: List[str]) -> dict:
    where = f"GPU {device.index} ({device.name})" if device else "an unknown GPU"
    instance = f", GPU instance {event.gpu_instance_id}" if event.gpu_instance_id is not None else ""
    return {
        "timestamp": int(event.timestamp),
        "event_type": "gpu_monitoring.xid",
        "source_type_name": "gpu_monitoring",
        "msg_title": f"XID {event.code} on {where}: {info.meaning}",
        "msg_text": (
            f"NVIDIA XID {event.code} ({info.meaning}, origin: {info.origin}) on {where}{instance}, "
            f"UUID {event.device_uuid}.\n\nWhat to do: {info.advice}"
        ),
        "alert_type": _ALERT[info.severity],
        "aggregation_key": f"gpu_monitoring.xid.{event.device_uuid}",
        "tags": tags,
    }
