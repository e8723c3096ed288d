"""PCIe throughput, replays and link training."""

from ..nvml.device import Device
from .base import Collector, CounterRates, Fields, copy_fields, put

BYTE_COUNTERS = [("pcie_tx_bytes", 0), ("pcie_rx_bytes", 0)]
SAMPLED_KIB_PER_S = [("pcie_tx_kib_per_s", 0), ("pcie_rx_kib_per_s", 0)]


class Pcie(Collector):
    """Throughput is the rate of NVML's PCIe byte counters between runs where the driver has
    them (one batched read); otherwise their fallback, nvmlDeviceGetPcieThroughput, which
    samples for 20 ms per direction (nvml.readings)."""

    name = "pcie"

    def __init__(self) -> None:
        self._rates = CounterRates()

    def fields(self, device: Device):
        return [("pcie_replay", 0), *BYTE_COUNTERS]

    def collect(self, device: Device, fields: Fields, out) -> None:
        m = out.metrics
        self._throughput(device, fields, m)
        generation, width = device.pcie_link()
        put(m, "pcie.link.generation", generation)
        put(m, "pcie.link.width", width)
        generation, width = device.pcie_link_max
        put(m, "pcie.link.generation.max", generation)
        put(m, "pcie.link.width.max", width)
        copy_fields(m, fields, {"pcie_replay": "pcie.replay_errors"})

    def _throughput(self, device: Device, fields: Fields, m) -> None:
        if all(key in fields for key in BYTE_COUNTERS):
            counters = tuple(fields[key] for key in BYTE_COUNTERS)
            rates = self._rates.update(device.index, device.fields_timestamp_us, counters)
            if rates is not None:
                m["pcie.throughput.tx"], m["pcie.throughput.rx"] = rates
        elif all(key in fields for key in SAMPLED_KIB_PER_S):
            m["pcie.throughput.tx"], m["pcie.throughput.rx"] = (fields[key] * 1024 for key in SAMPLED_KIB_PER_S)

    def forget(self) -> None:
        self._rates.forget()
