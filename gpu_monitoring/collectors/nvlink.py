"""NVLink state, throughput and error counters, all from the batched field values."""

from ..nvml.device import Device
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
        rates = self._rates.update(device.index, device.fields_timestamp_us, (sum(tx) * 1024.0, sum(rx) * 1024.0))
        if rates is not None:
            metrics["nvlink.throughput.tx"], metrics["nvlink.throughput.rx"] = rates

    def forget(self) -> None:
        self._rates.forget()
