"""NVLink state, throughput and error counters, all from the batched field values."""

import functools
from operator import itemgetter
from typing import Dict, Tuple

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

    def fields(self, device: Device):
        links = device.nvlink_count
        if not links:
            return []
        return [key for per_link in _keys(links) for key in per_link] + [(name, 0) for name in ERRORS]

    def collect(self, device: Device, fields: Fields, out) -> None:
        links = device.nvlink_count
        if not links:
            return
        states, tx, rx = (_answered(fields, keys) for keys in _keys(links))
        if states:
            out.metrics["nvlink.links.active"] = len(states) - list(states.values()).count(0)
            out.nvlink_down = sorted(link for link, up in states.items() if not up)
        copy_fields(out.metrics, fields, ERRORS)
        if len(tx) == len(rx) == links:
            self._throughput(device, sum(tx.values()), sum(rx.values()), out.metrics)

    def _throughput(self, device: Device, tx_kib: float, rx_kib: float, metrics) -> None:
        rates = self._rates.update(device.index, device.fields_timestamp_us, (tx_kib * 1024.0, rx_kib * 1024.0))
        if rates is not None:
            metrics["nvlink.throughput.tx"], metrics["nvlink.throughput.rx"] = rates

    def forget(self) -> None:
        self._rates.forget()


@functools.cache
def _keys(links: int) -> Tuple[Tuple[FieldKey, ...], ...]:
    """The per-link keys of state, TX and RX for this many links, made once."""
    names = ("nvlink_state", "nvlink_tx_kib", "nvlink_rx_kib")
    return tuple(tuple((name, link) for link in range(links)) for name in names)


def _answered(fields: Fields, keys: Tuple[FieldKey, ...]) -> Dict[int, float]:
    """{link: value} of the links whose key the fields answered."""
    try:  # every link answers, but on a GPU whose driver refuses some fields
        values = itemgetter(*keys)(fields)
    except KeyError:
        return {key[1]: fields[key] for key in keys if key in fields}
    return dict(enumerate(values if len(keys) > 1 else (values,)))  # one key: itemgetter gives the value
