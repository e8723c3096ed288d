"""MIG mode and instances; each instance is read by the collectors that work on MIG handles."""

import re
from typing import List, Optional

from gpu_monitoring.collectors.base import Collector, Fields
from gpu_monitoring.collectors.series import SeriesValue, fact, gauge, store
from gpu_monitoring.metrics.names import MIG_ENABLED, MIG_INSTANCES, PROCESSES_COUNT
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.nvml import NvmlDevice
from gpu_monitoring.snapshot import MigInstance

ENABLED, ENABLED_FACT = gauge(MIG_ENABLED), fact("mig_enabled")
INSTANCES, INSTANCES_FACT = gauge(MIG_INSTANCES), fact("mig_instances")
PROCESSES = gauge(PROCESSES_COUNT)

_PROFILE = re.compile(r"MIG (\S+)$")


class Mig(Collector):
    name = "mig"

    def __init__(self, instance_collectors: List[Collector], profile: Profile = EVERYTHING):
        super().__init__(profile)
        self.instance_collectors = instance_collectors

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        enabled = device.mig_enabled()
        if enabled is None:
            return []
        found = [(ENABLED, int(enabled)), (ENABLED_FACT, enabled)]
        if not enabled:
            return found
        instances = [self._instance(child) for child in device.mig_devices()]
        found += [(INSTANCES, len(instances)), (INSTANCES_FACT, instances)]
        if any(PROCESSES_COUNT in instance.metrics for instance in instances):
            found.append((PROCESSES, len({p.pid for i in instances for p in i.processes})))
        return found

    def _instance(self, child: NvmlDevice) -> MigInstance:
        profile_id, start, size = child.gpu_instance_layout or (None, None, None)
        instance = MigInstance(
            uuid=child.uuid,
            gpu_instance_id=child.gpu_instance_id,
            compute_instance_id=child.compute_instance_id,
            profile=_profile(child.name),
            gpu_instance_profile_id=profile_id,
            placement_start=start,
            placement_size=size,
        )
        for collector in self.instance_collectors:
            store(collector.collect(child, Fields()), instance)
        return instance


def _profile(name: Optional[str]) -> Optional[str]:
    match = _PROFILE.search(name or "")
    return match.group(1) if match else None
