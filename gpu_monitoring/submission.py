"""Snapshot to Datadog: metrics by the spec's types, per-device health, XID counts and events.

This layer never calls NVML; it reads the Snapshot and the health computed from it.
"""

from collections import Counter
from typing import Dict, List, Optional

from datadog_checks.base import AgentCheck

from . import xid
from .health import Health
from .metric_spec import SPEC
from .snapshot import Device, MigInstance, Snapshot

HEALTH_CHECK = "device.health"
_STATUS = {"OK": AgentCheck.OK, "WARNING": AgentCheck.WARNING, "CRITICAL": AgentCheck.CRITICAL}
_ALERT = {"critical": "error", "warning": "warning", "ok": "info"}


def device_tags(device: Device, snapshot: Snapshot) -> List[str]:
    tags = {
        "gpu_uuid": device.uuid,
        "gpu_index": device.index,
        "gpu_model": device.name,
        "gpu_architecture": device.architecture,
        "gpu_driver_version": snapshot.node.driver_version,
        "gpu_pci_bus_id": device.pci_bus_id,
        "gpu_slicing_mode": "mig_parent" if device.mig_enabled else "none",
    }
    return [f"{key}:{value}" for key, value in tags.items() if value is not None]


def mig_tags(instance: MigInstance, parent: Device, parent_tags: List[str]) -> List[str]:
    kept = [t for t in parent_tags if not t.startswith(("gpu_uuid:", "gpu_slicing_mode:"))]
    extra = {
        "gpu_uuid": instance.uuid,
        "gpu_parent_uuid": parent.uuid,
        "gpu_instance_id": instance.gpu_instance_id,
        "mig_profile": instance.profile,
        "gpu_slicing_mode": "mig",
    }
    return kept + [f"{key}:{value}" for key, value in extra.items() if value is not None]


class Submitter:
    def __init__(self, check: AgentCheck, base_tags: List[str]):
        self.check = check
        self.base_tags = list(base_tags)

    def submit(self, snapshot: Snapshot, healths: Dict[int, Health]) -> None:
        self.check.gauge("devices.count", len(snapshot.devices), tags=self.base_tags)
        by_uuid = {}
        for device in snapshot.devices:
            tags = self.base_tags + device_tags(device, snapshot)
            by_uuid[device.uuid] = (device, tags)
            self.metrics(device.metrics, tags)
            for instance in device.mig_instances:
                self.metrics(instance.metrics, self.base_tags + mig_tags(instance, device, tags[len(self.base_tags):]))
            health = healths[device.index]
            self.check.service_check(HEALTH_CHECK, _STATUS[health.status], tags=tags, message=health.message or None)
        self.xids(snapshot, by_uuid)

    def metrics(self, values: Dict[str, float], tags: List[str]) -> None:
        for name, value in values.items():
            metric = SPEC.get(name)
            if metric is None:
                self.check.log.debug("no spec for metric %s; not submitted", name)
                continue
            submit = self.check.monotonic_count if metric.type == "monotonic_count" else self.check.gauge
            submit(name, value, tags=tags)

    def xids(self, snapshot: Snapshot, by_uuid: Dict[Optional[str], tuple]) -> None:
        counts: Counter = Counter()
        for event in snapshot.events:
            if event.kind != "xid":
                continue
            device, tags = by_uuid.get(event.device_uuid, (None, self.base_tags))
            info = xid.describe(event.code)
            xid_tags = tags + [f"xid:{event.code}", f"xid_origin:{info.origin}", f"xid_action:{info.action}"]
            counts[tuple(xid_tags)] += 1
            self.check.event(self._event(event, info, device, xid_tags))
        for xid_tags, count in counts.items():
            self.check.count("xid_errors", count, tags=list(xid_tags))

    def _event(self, event, info: xid.Xid, device: Optional[Device], tags: List[str]) -> dict:
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
