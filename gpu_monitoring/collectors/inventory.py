"""Inventory, for drift across a fleet (not health): each GPU's VBIOS version and whether the
driver's persistence mode is on.

Cost: no NVML call in a steady run. The VBIOS does not change while the driver runs (a flashed one
takes effect at a GPU reset or a reboot): nvmlDeviceGetVbiosVersion once a session.
Persistence mode can change (`nvidia-smi -pm`, nvidia-persistenced started after the check):
nvmlDeviceGetPersistenceMode once a session, then again at the first run PERSISTENCE_INTERVAL
seconds (10 minutes) after the last read: one call per GPU every 10 minutes at most. Between reads
every snapshot carries the last answer. A metrics profile that does not send
device.persistence_mode (essential) reads neither.
"""

import time
from typing import Callable, List, Optional

from gpu_monitoring.collectors.base import Collector, Fields, Seldom
from gpu_monitoring.collectors.series import SeriesValue, fact, gauge
from gpu_monitoring.metrics.names import DEVICE_PERSISTENCE_MODE
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.nvml.device import NvmlDevice

PERSISTENCE_INTERVAL = 600.0
VBIOS_VERSION, PERSISTENCE_MODE = fact("vbios_version"), fact("persistence_mode")
# Submission makes this metric of both facts, tagged with the VBIOS; nothing else reads them.
SUBMITTED = gauge(DEVICE_PERSISTENCE_MODE)


class Inventory(Collector):
    """`clock` gives the seconds persistence mode is timed by (monotonic)."""

    name = "inventory"

    def __init__(self, clock: Callable[[], float] = time.monotonic, profile: Profile = EVERYTHING) -> None:
        super().__init__(profile)
        # Each GPU's last persistence mode NVML gave, and when it was asked.
        self._persistence: Seldom[bool] = Seldom(PERSISTENCE_INTERVAL, clock)

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        if not self.wants(SUBMITTED):
            return []
        mode: Optional[bool] = self._persistence.get(device.index, device.persistence_mode)
        return [(VBIOS_VERSION, device.vbios_version), (PERSISTENCE_MODE, mode)]

    def forget(self) -> None:
        self._persistence.forget()
