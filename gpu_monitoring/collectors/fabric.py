"""A GPU's registration with its NVLink fabric (NVSwitch systems: HGX/DGX, NVL72 racks), one
nvmlDeviceGetGpuFabricInfoV call a run where the driver answers it; nvml.fabric says what its
answer means."""

from typing import List, Set

from gpu_monitoring.collectors.base import Collector, Fields
from gpu_monitoring.collectors.series import SeriesValue, fact, gauge
from gpu_monitoring.metrics.names import (
    FABRIC_HEALTH_ACCESS_TIMEOUT_RECOVERY,
    FABRIC_HEALTH_DEGRADED_BANDWIDTH,
    FABRIC_HEALTH_ROUTE_RECOVERY,
    FABRIC_HEALTH_ROUTE_UNHEALTHY,
    FABRIC_HEALTH_SUMMARY,
    FABRIC_STATE,
)
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.fabric import FabricStatus

STATE = gauge(FABRIC_STATE)
SUMMARY = gauge(FABRIC_HEALTH_SUMMARY)
# By the flag names of FabricStatus.flags.
FLAGS = {
    "degraded_bandwidth": gauge(FABRIC_HEALTH_DEGRADED_BANDWIDTH),
    "route_recovery": gauge(FABRIC_HEALTH_ROUTE_RECOVERY),
    "route_unhealthy": gauge(FABRIC_HEALTH_ROUTE_UNHEALTHY),
    "access_timeout_recovery": gauge(FABRIC_HEALTH_ACCESS_TIMEOUT_RECOVERY),
}
CLIQUE_ID, CLUSTER_UUID = fact("fabric_clique_id"), fact("fabric_cluster_uuid")
ERROR, UNTRUSTED = fact("fabric_error"), fact("fabric_untrusted")


class Fabric(Collector):
    """A GPU whose driver answers state NOT_SUPPORTED (no NVSwitch to register with) has none until
    the driver is loaded again, which restarts NVML: it is not asked again this session."""

    name = "fabric"

    def __init__(self, profile: Profile = EVERYTHING) -> None:
        super().__init__(profile)
        self._without: Set[int] = set()

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        if device.index in self._without:
            return []
        status = device.fabric_status()
        if status is None:
            return []
        if not status.supported:
            self._without.add(device.index)  # as a driver that refuses the call: no series
            return []
        return _readings(status)

    def forget(self) -> None:
        self._without = set()


def _readings(status: FabricStatus) -> List[SeriesValue]:
    found: List[SeriesValue] = [(STATE, status.state)]
    if status.cluster_uuid is not None:
        found += [(CLIQUE_ID, status.clique_id), (CLUSTER_UUID, status.cluster_uuid)]
    if status.errors:
        found.append((ERROR, "; ".join(status.errors)))
    found += [(FLAGS[name], flag) for name, flag in status.flags.items()]
    return found + [(SUMMARY, status.summary), (UNTRUSTED, list(status.untrusted))]
