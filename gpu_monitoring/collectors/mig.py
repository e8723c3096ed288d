"""MIG mode and instances; each instance is read by the collectors that work on MIG handles."""

import re
from typing import List, Optional

from ..nvml.device import Device
from ..snapshot import MigInstance
from .base import Collector, Fields

_PROFILE = re.compile(r"MIG (\S+)$")


class Mig(Collector):
    name = "mig"

    def __init__(self, instance_collectors: List[Collector]):
        self.instance_collectors = instance_collectors

    def collect(self, device: Device, fields: Fields, out) -> None:
        enabled = device.mig_enabled()
        if enabled is None:
            return
        out.metrics["mig.enabled"] = int(enabled)
        out.mig_enabled = enabled
        if not enabled:
            return
        out.mig_instances = [self._instance(child) for child in device.mig_devices()]
        out.metrics["mig.instances"] = len(out.mig_instances)
        if any("processes.count" in instance.metrics for instance in out.mig_instances):
            out.metrics["processes.count"] = len({p.pid for i in out.mig_instances for p in i.processes})

    def _instance(self, child: Device) -> MigInstance:
        instance = MigInstance(
            uuid=child.uuid,
            gpu_instance_id=child.gpu_instance_id,
            compute_instance_id=child.compute_instance_id,
            profile=_profile(child.name),
        )
        for collector in self.instance_collectors:
            collector.collect(child, Fields(), instance)
        return instance


def _profile(name: Optional[str]) -> Optional[str]:
    match = _PROFILE.search(name or "")
    return match.group(1) if match else None
