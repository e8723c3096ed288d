"""The driver's recovery action: one batched field, read each run (nothing to call)."""

from typing import List

from ..nvml.device import Device
from ..recovery_actions import ACTIONS, UNKNOWN
from .base import Collector, Fields
from .series import Reading, fact, gauge

KEY = ("recovery_action", 0)
# The value is also a tag, so that a monitor can name the action; one series per action, made once.
SERIES = {name: gauge("device.recovery_action", (f"recovery_action:{name}",))
          for name in [action.name for action in ACTIONS.values()] + [UNKNOWN]}
ACTION = fact("recovery_action")


class Recovery(Collector):
    name = "recovery"

    def fields(self, device: Device, links: int):
        return [KEY]

    def collect(self, device: Device, fields: Fields) -> List[Reading]:
        value = fields.get(KEY)
        if value is None:
            return []
        action = ACTIONS.get(value)
        return [(SERIES[action.name if action else UNKNOWN], value), (ACTION, int(value))]
