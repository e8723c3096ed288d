"""NVLink-C2C, the link between a Grace Hopper or Grace Blackwell GPU and its CPU: link count, each
link's status and error counters, from the batched field values. Other GPUs have no C2C link."""

import functools
from typing import Dict, List, Tuple

from gpu_monitoring.collectors.base import Collector, Fields
from gpu_monitoring.collectors.series import Series, SeriesValue, fact, gauge, monotonic_count
from gpu_monitoring.metrics.names import (
    C2C_ERRORS_INTERRUPT,
    C2C_ERRORS_REPLAY,
    C2C_ERRORS_REPLAY_B2B,
    C2C_LINKS_ACTIVE,
    C2C_LINKS_TOTAL,
)
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.fields import FieldKey
from gpu_monitoring.nvml.readings import c2c_link_count, field

STATUS = "c2c_status"
COUNTERS = {"c2c_errors_interrupt": C2C_ERRORS_INTERRUPT, "c2c_errors_replay": C2C_ERRORS_REPLAY,
            "c2c_errors_replay_b2b": C2C_ERRORS_REPLAY_B2B}
TOTALS = {name: monotonic_count(metric) for name, metric in COUNTERS.items()}
LINKS_TOTAL, LINKS_ACTIVE = gauge(C2C_LINKS_TOTAL), gauge(C2C_LINKS_ACTIVE)
DOWN = fact("c2c_down")
_ACTIVE = 1  # nvml.h: NVML_FI_DEV_C2C_LINK_GET_STATUS is 0 inactive, 1 active


class C2c(Collector):
    """The link count is read once a session, where the per-link keys are worked out."""

    name = "c2c"

    def __init__(self, profile: Profile = EVERYTHING) -> None:
        super().__init__(profile)
        self._links: Dict[int, int] = {}

    def fields(self, device: NvmlDevice, links: int):
        count = self._links[device.index] = c2c_link_count(device)
        return [key for link in range(count) for key in _link_keys(link)]

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        count = self._links.get(device.index, 0)
        if not count:
            return []
        found: List[SeriesValue] = [(LINKS_TOTAL, count)]
        states = {link: fields[(STATUS, link)] for link in range(count) if (STATUS, link) in fields}
        if states:
            found += [(LINKS_ACTIVE, sum(state == _ACTIVE for state in states.values())),
                      (DOWN, [link for link, state in states.items() if state != _ACTIVE])]
            found += [(_link_series(link)[0], int(state == _ACTIVE)) for link, state in states.items()]
        for name, total in TOTALS.items():
            values = [fields.get((name, link)) for link in range(count)]
            # A link that did not answer leaves the total out: it would read as a counter reset.
            if None not in values:
                found.append((total, sum(values)))
            found += [(_link_series(link)[1][name], value)
                      for link, value in enumerate(values) if value is not None]
        return found

    def forget(self) -> None:
        self._links = {}


@functools.cache
def _link_keys(link: int) -> Tuple[FieldKey, ...]:
    return (field(STATUS, link), *(field(name, link) for name in COUNTERS))


@functools.cache
def _link_series(link: int) -> Tuple[Series, Dict[str, Series]]:
    """A link's status series and its counters', under its `c2c_link` tag, made once."""
    tags = (f"c2c_link:{link}",)
    return (gauge(C2C_LINKS_ACTIVE, tags),
            {name: monotonic_count(metric, tags) for name, metric in COUNTERS.items()})
