"""PCIe throughput, replays and link training."""

from typing import List, Optional

from ..nvml import fallbacks
from ..nvml.device import Device
from .activity import Gpm
from .base import Collector, CounterRates, Fields, from_fields
from .series import Reading, gauge, monotonic_count

BYTE_COUNTERS = [("pcie_tx_bytes", 0), ("pcie_rx_bytes", 0)]
SAMPLED_KIB_PER_S = [("pcie_tx_kib_per_s", 0), ("pcie_rx_kib_per_s", 0)]
THROUGHPUT = (gauge("pcie.throughput.tx"), gauge("pcie.throughput.rx"))
LINK = (gauge("pcie.link.generation"), gauge("pcie.link.width"))
LINK_MAX = (gauge("pcie.link.generation.max"), gauge("pcie.link.width.max"))
FIELDS = {("pcie_replay", 0): monotonic_count("pcie.replay_errors")}


class Pcie(Collector):
    """Throughput comes from the best source a GPU has:
    - GPM (Hopper and later): the interval's average, which the gpm collector, run before this
      one, has read already;
    - NVML's PCIe byte counters, where the driver keeps them in 64 bits: their rate between runs,
      from the one batched read;
    - otherwise nvmlDeviceGetPcieThroughput, which samples 20 ms per direction: the counters'
      fallback (nvml.readings), or asked here when GPM had no rate (its first sample, a MIG
      parent it does not answer for).
    """

    name = "pcie"

    def __init__(self, gpm: Optional[Gpm] = None) -> None:
        self._rates = CounterRates()
        self._gpm = gpm

    def fields(self, device: Device, links: int):
        if self._from_gpm(device):
            return list(FIELDS)
        return [*FIELDS, *BYTE_COUNTERS]

    def collect(self, device: Device, fields: Fields) -> List[Reading]:
        return [
            *zip(THROUGHPUT, self._throughput(device, fields)),
            *zip(LINK, device.pcie_link()),
            *zip(LINK_MAX, device.pcie_link_max),
            *from_fields(fields, FIELDS),
        ]

    def _from_gpm(self, device: Device) -> bool:
        return self._gpm is not None and device.gpm_supported

    def _throughput(self, device: Device, fields: Fields) -> tuple:
        """Bytes per second sent and received; () where this collector has none to give."""
        if self._gpm is not None and self._gpm.gave_pcie(device):
            return ()
        if all(key in fields for key in BYTE_COUNTERS):
            counters = tuple(fields[key] for key in BYTE_COUNTERS)
            return self._rates.update(device.index, fields.timestamp_us, counters) or ()
        if all(key in fields for key in SAMPLED_KIB_PER_S):
            sampled = [fields[key] for key in SAMPLED_KIB_PER_S]
        elif self._from_gpm(device):
            sampled = fallbacks.sampled_pcie_throughput(device)
        else:
            return ()
        return tuple(kib_per_s * 1024 for kib_per_s in sampled or ())

    def forget(self) -> None:
        self._rates.forget()
