"""PCIe throughput, replays and link training."""

from ..nvml import fallbacks
from ..nvml.device import Device
from .base import Collector, CounterRates, Fields, copy_fields, put

BYTE_COUNTERS = [("pcie_tx_bytes", 0), ("pcie_rx_bytes", 0)]
SAMPLED_KIB_PER_S = [("pcie_tx_kib_per_s", 0), ("pcie_rx_kib_per_s", 0)]
THROUGHPUT = ("pcie.throughput.tx", "pcie.throughput.rx")


class Pcie(Collector):
    """Throughput comes from the best source a GPU has:
    - GPM (Hopper and later): the interval's average, which the gpm collector, run before this
      one, has put in the device's metrics already;
    - NVML's PCIe byte counters, where the driver keeps them in 64 bits: their rate between runs,
      from the one batched read;
    - otherwise nvmlDeviceGetPcieThroughput, which samples 20 ms per direction: the counters'
      fallback (nvml.readings), or asked here when GPM had no rate (its first sample, a MIG
      parent it does not answer for).
    """

    name = "pcie"

    def __init__(self, gpm_collects: bool = True) -> None:
        self._rates = CounterRates()
        self._gpm_collects = gpm_collects

    def fields(self, device: Device, links: int):
        if self._from_gpm(device):
            return [("pcie_replay", 0)]
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

    def _from_gpm(self, device: Device) -> bool:
        return self._gpm_collects and device.gpm_supported

    def _throughput(self, device: Device, fields: Fields, m) -> None:
        if THROUGHPUT[0] in m:
            return
        if all(key in fields for key in BYTE_COUNTERS):
            counters = tuple(fields[key] for key in BYTE_COUNTERS)
            rates = self._rates.update(device.index, fields.timestamp_us, counters)
            if rates is not None:
                m[THROUGHPUT[0]], m[THROUGHPUT[1]] = rates
            return
        if all(key in fields for key in SAMPLED_KIB_PER_S):
            sampled = [fields[key] for key in SAMPLED_KIB_PER_S]
        elif self._from_gpm(device):
            sampled = fallbacks.sampled_pcie_throughput(device)
        else:
            return
        if sampled:
            m[THROUGHPUT[0]], m[THROUGHPUT[1]] = (kib_per_s * 1024 for kib_per_s in sampled)

    def forget(self) -> None:
        self._rates.forget()
