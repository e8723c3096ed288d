"""The driver's recovery action: one batched field, read each run (nothing to call)."""

from typing import List

from gpu_monitoring.collectors.base import Collector, Fields
from gpu_monitoring.collectors.series import SeriesValue, fact, gauge
from gpu_monitoring.health.recovery_actions import ACTIONS, UNKNOWN
from gpu_monitoring.metrics.names import DEVICE_RECOVERY_ACTION
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.readings import field

KEY = field("recovery_action")
# The value is also a tag, so that a monitor can name the action; one series per action, made once.
SERIES = {name: gauge(DEVICE_RECOVERY_ACTION, (f"recovery_action:{name}",))
          for name in [action.name for action in ACTIONS.values()] + [UNKNOWN]}
ACTION = fact("recovery_action")


class Recovery(Collector):
    name = "recovery"

    def fields(self, device: NvmlDevice, links: int):
        return [KEY]

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        value = fields.get(KEY)
        if value is None:
            return []
        action = ACTIONS.get(value)
        return [(SERIES[action.name if action else UNKNOWN], value), (ACTION, int(value))]
