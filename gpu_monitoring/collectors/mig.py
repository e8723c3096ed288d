"""MIG mode and instances; each instance is read by the collectors that work on MIG handles.

MIG mode is not asked every run. nvml.h (nvmlDeviceSetMigMode, nvmlDeviceGetMigMode): a mode set
takes effect only at the GPU's next "activation trigger", the driver unbinding or resetting it, which
it refuses while the GPU is in use (NVML_ERROR_IN_USE); until then nvmlDeviceGetMigMode answers the
new mode as the pending one. So it is asked again at the first run of an NVML session (a reset that
costs the GPU its handle restarts the session); at every run where the GPU lists no process, and the
first run after one (idle, it may change mode before a new process starts); where the mode set
differs from the current one (waiting for a reset), or where the last read got no answer; and every
MIG_MODE_INTERVAL seconds whatever happens, for a change made between two runs that both found
processes on the GPU. A busy GPU costs
one call every 5 minutes instead of one a run (nvmlDeviceGetMigMode took 0.44 ms on a real H100,
tests/data/real).
"""

import re
import time
from typing import Callable, Dict, List, Optional, Tuple

from gpu_monitoring.collectors.base import Collector, Fields, Seldom
from gpu_monitoring.collectors.processes import Processes
from gpu_monitoring.collectors.series import SeriesValue, fact, gauge, store
from gpu_monitoring.metrics.names import MIG_ENABLED, MIG_INSTANCES, PROCESSES_COUNT
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.snapshot import MigInstance

ENABLED, ENABLED_FACT = gauge(MIG_ENABLED), fact("mig_enabled")
INSTANCES, INSTANCES_FACT = gauge(MIG_INSTANCES), fact("mig_instances")
PROCESSES = gauge(PROCESSES_COUNT)

_PROFILE = re.compile(r"MIG (\S+)$")
MIG_MODE_INTERVAL = 300.0


class Mig(Collector):
    """`processes` is the collector that lists each GPU's processes (None where it does not run: the
    mode is then asked every run); `clock` gives the seconds MIG mode is timed by (monotonic)."""

    name = "mig"

    def __init__(self, instance_collectors: List[Collector], profile: Profile = EVERYTHING,
                 processes: Optional[Processes] = None, clock: Callable[[], float] = time.monotonic):
        super().__init__(profile)
        self.instance_collectors = instance_collectors
        self._processes = processes
        self._modes: Seldom[Tuple[bool, bool]] = Seldom(MIG_MODE_INTERVAL, clock)  # (current, pending) by GPU
        self._idle_before: Dict[int, bool] = {}  # whether each GPU listed no process at the run before

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        modes = self._modes.get(device.index, device.mig_modes, again=self._may_change(device))
        if modes is None:
            return []
        enabled = modes[0]
        found = [(ENABLED, int(enabled)), (ENABLED_FACT, enabled)]
        if not enabled:
            return found
        instances = [self._instance(child) for child in device.mig_devices()]
        found += [(INSTANCES, len(instances)), (INSTANCES_FACT, instances)]
        if any(PROCESSES_COUNT in instance.metrics for instance in instances):
            found.append((PROCESSES, len({p.pid for i in instances for p in i.processes})))
        return found

    def _may_change(self, device: NvmlDevice) -> bool:
        """Whether the GPU's MIG mode may have changed since it was last read, as the module says."""
        idle = self._processes is None or not self._processes.listed_any(device)
        idle_before, self._idle_before[device.index] = self._idle_before.get(device.index, True), idle
        last = self._modes.last(device.index)
        return last is None or last[0] != last[1] or idle or idle_before

    def forget(self) -> None:
        self._modes.forget()
        self._idle_before = {}

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
