"""NVLink state, throughput and error counters, all from the batched field values."""

import functools
from operator import itemgetter
from typing import Tuple

from ..nvml.device import Device
from ..nvml.fields import FieldKey
from .base import Collector, CounterRates, Fields, copy_fields

ERRORS = {
    "nvlink_crc_flit": "nvlink.errors.crc_flit",
    "nvlink_crc_data": "nvlink.errors.crc_data",
    "nvlink_replay": "nvlink.errors.replay",
    "nvlink_recovery": "nvlink.errors.recovery",
}


class NvLink(Collector):
    """Throughput is the rate of NVML's per-link KiB counters between two runs."""

    name = "nvlink"

    def __init__(self) -> None:
        self._rates = CounterRates()

    def fields(self, device: Device, links: int):
        if not links:
            return []
        return [key for per_link in _keys(links) for key in per_link] + [(name, 0) for name in ERRORS]

    def collect(self, device: Device, fields: Fields, out) -> None:
        links = fields.links
        if not links:
            return
        state_keys, tx_keys, rx_keys = _keys(links)
        states = _every_link(fields, state_keys)
        # Where the driver answered the state of some links only, those are counted.
        by_link = dict(enumerate(states)) if states else {key[1]: fields[key] for key in state_keys if key in fields}
        if by_link:
            out.metrics["nvlink.links.active"] = sum(1 for up in by_link.values() if up)
            out.nvlink_down = [link for link, up in by_link.items() if not up]
        copy_fields(out.metrics, fields, ERRORS)
        tx, rx = _every_link(fields, tx_keys), _every_link(fields, rx_keys)
        if tx and rx:
            self._throughput(device, fields.timestamp_us, sum(tx), sum(rx), out.metrics)

    def _throughput(self, device: Device, timestamp_us: int, tx_kib: float, rx_kib: float, metrics) -> None:
        rates = self._rates.update(device.index, timestamp_us, (tx_kib * 1024.0, rx_kib * 1024.0))
        if rates is not None:
            metrics["nvlink.throughput.tx"], metrics["nvlink.throughput.rx"] = rates

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
