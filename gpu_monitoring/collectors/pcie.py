"""PCIe throughput, replays and link training."""

from typing import Dict, List, Optional, Tuple

from gpu_monitoring.collectors.base import Collector, CounterRates, Fields, from_fields
from gpu_monitoring.collectors.series import SeriesValue, gauge, monotonic_count
from gpu_monitoring.collectors.utilization import Gpm
from gpu_monitoring.metrics.names import (
    PCIE_LINK_GENERATION,
    PCIE_LINK_GENERATION_MAX,
    PCIE_LINK_WIDTH,
    PCIE_LINK_WIDTH_MAX,
    PCIE_REPLAY_ERRORS,
    PCIE_THROUGHPUT_RX,
    PCIE_THROUGHPUT_TX,
)
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.readings import field

BYTE_COUNTERS = [field("pcie_tx_bytes"), field("pcie_rx_bytes")]
SAMPLED_KIB_PER_S = [field("pcie_tx_kib_per_s"), field("pcie_rx_kib_per_s")]
THROUGHPUT = (gauge(PCIE_THROUGHPUT_TX), gauge(PCIE_THROUGHPUT_RX))
LINK = (gauge(PCIE_LINK_GENERATION), gauge(PCIE_LINK_WIDTH))
LINK_MAX = (gauge(PCIE_LINK_GENERATION_MAX), gauge(PCIE_LINK_WIDTH_MAX))
FIELDS = {field("pcie_replay"): monotonic_count(PCIE_REPLAY_ERRORS)}
RECOVERIES = field("pcie_recoveries")


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

    def __init__(self, gpm: Optional[Gpm] = None, profile: Profile = EVERYTHING) -> None:
        super().__init__(profile)
        self._rates = CounterRates()
        self._gpm = gpm
        self._links: Dict[int, Tuple[float, tuple]] = {}  # each GPU's link, and the recoveries counted then

    def fields(self, device: NvmlDevice, links: int):
        if self._from_gpm(device):
            return [*FIELDS, RECOVERIES]
        return [*FIELDS, RECOVERIES, *BYTE_COUNTERS]

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        return [
            *zip(THROUGHPUT, self._throughput(device, fields)),
            *zip(LINK, self._link(device, fields)),
            *zip(LINK_MAX, device.pcie_link_max),
            *from_fields(fields, FIELDS),
        ]

    def _link(self, device: NvmlDevice, fields: Fields) -> tuple:
        """The link's current generation and width. A PCIe link changes speed or width only by going
        through the Recovery state of its training (PCIe base specification, LTSSM), which the driver
        counts: they are read again only when that count moved since they were, and every run where
        the driver does not count."""
        recoveries = fields.get(RECOVERIES)
        known = self._links.get(device.index)
        if known is not None and recoveries is not None and known[0] == recoveries:
            return known[1]
        link = device.pcie_link()
        if recoveries is not None and None not in link:
            self._links[device.index] = (recoveries, link)
        return link

    def _from_gpm(self, device: NvmlDevice) -> bool:
        return self._gpm is not None and device.gpm_supported

    def _throughput(self, device: NvmlDevice, fields: Fields) -> tuple:
        """Bytes per second sent and received; () where this collector has none to give."""
        if self._gpm is not None and self._gpm.gave_pcie(device):
            return ()
        if all(key in fields for key in BYTE_COUNTERS):
            counters = tuple(fields[key] for key in BYTE_COUNTERS)
            return self._rates.update(device.index, fields.timestamp_us, counters) or ()
        if all(key in fields for key in SAMPLED_KIB_PER_S):
            sampled = [fields[key] for key in SAMPLED_KIB_PER_S]
        elif self._from_gpm(device):
            sampled = device.sampled_pcie_throughput()
        else:
            return ()
        return tuple(kib_per_s * 1024 for kib_per_s in sampled or ())

    def forget(self) -> None:
        self._rates.forget()
        self._links = {}
