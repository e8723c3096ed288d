"""NVLink state, throughput and error counters, all from the batched field values."""

from typing import Dict, Tuple

from ..nvml import Device
from .base import Collector, Fields, copy_fields

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
        self._previous: Dict[int, Tuple[int, float, float]] = {}  # device -> (µs, tx bytes, rx bytes)

    def fields(self, device: Device):
        links = range(device.nvlink_count)
        if not links:
            return []
        per_link = [(name, link) for link in links for name in ("nvlink_state", "nvlink_tx_kib", "nvlink_rx_kib")]
        return per_link + [(name, 0) for name in ERRORS]

    def collect(self, device: Device, fields: Fields, out) -> None:
        links = range(device.nvlink_count)
        if not links:
            return
        states = {link: fields[("nvlink_state", link)] for link in links if ("nvlink_state", link) in fields}
        if states:
            out.metrics["nvlink.links.active"] = sum(1 for up in states.values() if up)
            out.nvlink_down = sorted(link for link, up in states.items() if not up)
        copy_fields(out.metrics, fields, ERRORS)
        self._throughput(device, fields, links, out.metrics)

    def _throughput(self, device: Device, fields: Fields, links: range, metrics) -> None:
        tx = [fields.get(("nvlink_tx_kib", link)) for link in links]
        rx = [fields.get(("nvlink_rx_kib", link)) for link in links]
        if None in tx or None in rx:
            return
        now = device.fields_timestamp_us
        current = (now, sum(tx) * 1024.0, sum(rx) * 1024.0)
        previous = self._previous.get(device.index)
        self._previous[device.index] = current
        if previous is None or now <= previous[0] or current[1] < previous[1] or current[2] < previous[2]:
            return
        seconds = (now - previous[0]) / 1e6
        metrics["nvlink.throughput.tx"] = (current[1] - previous[1]) / seconds
        metrics["nvlink.throughput.rx"] = (current[2] - previous[2]) / seconds

    def forget(self) -> None:
        self._previous = {}
