"""NVLink state, throughput and error counters, all from the batched field values."""

import functools
from operator import itemgetter
from typing import List, Tuple

from ..nvml.device import Device
from ..nvml.fields import FieldKey
from .base import Collector, CounterRates, Fields, from_fields
from .series import Reading, fact, gauge, monotonic_count

ERRORS = {
    ("nvlink_crc_flit", 0): monotonic_count("nvlink.errors.crc_flit"),
    ("nvlink_crc_data", 0): monotonic_count("nvlink.errors.crc_data"),
    ("nvlink_replay", 0): monotonic_count("nvlink.errors.replay"),
    ("nvlink_recovery", 0): monotonic_count("nvlink.errors.recovery"),
}
LINKS_ACTIVE = gauge("nvlink.links.active")
LINKS_DOWN = fact("nvlink_down")
THROUGHPUT = (gauge("nvlink.throughput.tx"), gauge("nvlink.throughput.rx"))


class NvLink(Collector):
    """Throughput is the rate of NVML's per-link KiB counters between two runs."""

    name = "nvlink"

    def __init__(self) -> None:
        self._rates = CounterRates()

    def fields(self, device: Device, links: int):
        if not links:
            return []
        return [key for per_link in _keys(links) for key in per_link] + list(ERRORS)

    def collect(self, device: Device, fields: Fields) -> List[Reading]:
        links = fields.links
        if not links:
            return []
        state_keys, tx_keys, rx_keys = _keys(links)
        states = _every_link(fields, state_keys)
        # Where the driver answered the state of some links only, those are counted.
        by_link = dict(enumerate(states)) if states else {key[1]: fields[key] for key in state_keys if key in fields}
        found = from_fields(fields, ERRORS)
        if by_link:
            found += [(LINKS_ACTIVE, sum(1 for up in by_link.values() if up)),
                      (LINKS_DOWN, [link for link, up in by_link.items() if not up])]
        tx, rx = _every_link(fields, tx_keys), _every_link(fields, rx_keys)
        if tx and rx:
            rates = self._rates.update(device.index, fields.timestamp_us, (sum(tx) * 1024.0, sum(rx) * 1024.0))
            found += zip(THROUGHPUT, rates or ())
        return found

    def forget(self) -> None:
        self._rates.forget()


@functools.cache
def _keys(links: int) -> Tuple[Tuple[FieldKey, ...], ...]:
    """The per-link keys of state, TX and RX for this many links, made once."""
    names = ("nvlink_state", "nvlink_tx_kib", "nvlink_rx_kib")
    return tuple(tuple((name, link) for link in range(links)) for name in names)


def _every_link(fields: Fields, keys: Tuple[FieldKey, ...]) -> Tuple[float, ...]:
    """The value of every link, in link order; empty unless the fields answered all of them."""
    try:
        values = itemgetter(*keys)(fields)
    except KeyError:
        return ()
    return values if len(keys) > 1 else (values,)  # one key: itemgetter gives the value itself
