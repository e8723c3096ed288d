"""NVLink-C2C, the link between a Grace Hopper or Grace Blackwell GPU and its CPU: link count, each
link's status and error counters, from the batched field values. Other GPUs have no C2C link."""

import functools
from typing import Dict, List, Tuple

from gpu_monitoring.collectors.base import Collector, Fields
from gpu_monitoring.collectors.series import Series, SeriesValue, fact, gauge, monotonic_count
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.fields import FieldKey
from gpu_monitoring.nvml.readings import c2c_link_count

COUNTERS = {"c2c_errors_interrupt": "errors.interrupt", "c2c_errors_replay": "errors.replay",
            "c2c_errors_replay_b2b": "errors.replay.b2b"}
TOTALS = {name: monotonic_count(f"c2c.{metric}") for name, metric in COUNTERS.items()}
LINKS_TOTAL, LINKS_ACTIVE = gauge("c2c.links.total"), gauge("c2c.links.active")
DOWN = fact("c2c_down")
_ACTIVE = 1  # nvml.h: NVML_FI_DEV_C2C_LINK_GET_STATUS is 0 inactive, 1 active


class C2c(Collector):
    """The link count is read once a session, where the per-link keys are worked out."""

    name = "c2c"

    def __init__(self) -> None:
        self._links: Dict[int, int] = {}

    def fields(self, device: NvmlDevice, links: int):
        count = self._links[device.index] = c2c_link_count(device)
        return [key for link in range(count) for key in _link_keys(link)]

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        count = self._links.get(device.index, 0)
        if not count:
            return []
        found: List[SeriesValue] = [(LINKS_TOTAL, count)]
        states = {link: fields[("c2c_status", link)] for link in range(count) if ("c2c_status", link) in fields}
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
    return (("c2c_status", link), *((name, link) for name in COUNTERS))


@functools.cache
def _link_series(link: int) -> Tuple[Series, Dict[str, Series]]:
    """A link's status series and its counters', under its `c2c_link` tag, made once."""
    tags = (f"c2c_link:{link}",)
    return (gauge("c2c.links.active", tags),
            {name: monotonic_count(f"c2c.{metric}", tags) for name, metric in COUNTERS.items()})
