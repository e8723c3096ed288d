"""NVLink state, throughput and error counters, all from the batched field values."""

import functools
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

    def fields(self, device: Device):
        links = device.nvlink_count
        if not links:
            return []
        return [key for per_link in _keys(links) for key in per_link] + [(name, 0) for name in ERRORS]

    def collect(self, device: Device, fields: Fields, out) -> None:
        links = device.nvlink_count
        if not links:
            return
        state_keys, tx_keys, rx_keys = _keys(links)
        states = {key[1]: fields[key] for key in state_keys if key in fields}
        if states:
            out.metrics["nvlink.links.active"] = sum(1 for up in states.values() if up)
            out.nvlink_down = sorted(link for link, up in states.items() if not up)
        copy_fields(out.metrics, fields, ERRORS)
        self._throughput(device, [fields.get(key) for key in tx_keys], [fields.get(key) for key in rx_keys],
                         out.metrics)

    def _throughput(self, device: Device, tx: list, rx: list, metrics) -> None:
        if None in tx or None in rx:
            return
        rates = self._rates.update(device.index, device.fields_timestamp_us, (sum(tx) * 1024.0, sum(rx) * 1024.0))
        if rates is not None:
            metrics["nvlink.throughput.tx"], metrics["nvlink.throughput.rx"] = rates

    def forget(self) -> None:
        self._rates.forget()


@functools.cache
def _keys(links: int) -> Tuple[Tuple[FieldKey, ...], ...]:
    """The per-link keys of state, TX and RX for this many links, made once."""
    names = ("nvlink_state", "nvlink_tx_kib", "nvlink_rx_kib")
    return tuple(tuple((name, link) for link in range(links)) for name in names)
