"""Engine utilization (NVML sampling) and GPM profiling metrics (Hopper and later)."""

from typing import Dict, List, Optional, Set, Tuple

from gpu_monitoring.collectors.base import Collector, Fields, sample_key
from gpu_monitoring.collectors.series import SeriesValue, fact, gauge
from gpu_monitoring.metrics.names import (
    DRAM_ACTIVE,
    FP16_ACTIVE,
    FP32_ACTIVE,
    FP64_ACTIVE,
    GRAPHICS_ACTIVE,
    PCIE_THROUGHPUT_RX,
    PCIE_THROUGHPUT_TX,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    UTILIZATION_DECODER,
    UTILIZATION_ENCODER,
    UTILIZATION_GPU,
    UTILIZATION_MEMORY,
)
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.errors import CannotAnswer
from gpu_monitoring.nvml.gpm import GpmMetric, GpmSampler

GPU, MEMORY = gauge(UTILIZATION_GPU), gauge(UTILIZATION_MEMORY)
ENCODER, DECODER = gauge(UTILIZATION_ENCODER), gauge(UTILIZATION_DECODER)
GPM_SERIES = {
    GpmMetric.GRAPHICS_UTIL: gauge(GRAPHICS_ACTIVE),
    GpmMetric.SM_UTIL: gauge(SM_ACTIVE),
    GpmMetric.SM_OCCUPANCY: gauge(SM_OCCUPANCY),
    GpmMetric.ANY_TENSOR_UTIL: gauge(TENSOR_ACTIVE),
    GpmMetric.DRAM_BW_UTIL: gauge(DRAM_ACTIVE),
    GpmMetric.FP64_UTIL: gauge(FP64_ACTIVE),
    GpmMetric.FP32_UTIL: gauge(FP32_ACTIVE),
    GpmMetric.FP16_UTIL: gauge(FP16_ACTIVE),
    GpmMetric.PCIE_TX_PER_SEC: gauge(PCIE_THROUGHPUT_TX),
    GpmMetric.PCIE_RX_PER_SEC: gauge(PCIE_THROUGHPUT_RX),
}
ACTIVITY_SOURCE = fact("activity_source")


class Utilization(Collector):
    name = "utilization"

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        found = []
        rates = device.utilization_rates()
        if rates is not None:
            found += [(GPU, rates[0]), (MEMORY, rates[1])]
        if self.wants(ENCODER):
            found.append((ENCODER, device.encoder_utilization()))
        if self.wants(DECODER):
            found.append((DECODER, device.decoder_utilization()))
        return found


class Gpm(Collector):
    """One sampler per GPU, or per GPU instance of a MIG device, kept across runs. A whole GPU's
    sample gives its PCIe throughput too, for the pcie collector (where that one runs), which asks
    `gave_pcie` whether this run's did."""

    name = "gpm"

    def __init__(self, pcie: bool = True, profile: Profile = EVERYTHING) -> None:
        super().__init__(profile)
        self._samplers: Dict[Tuple[int, Optional[int]], GpmSampler] = {}
        self._pcie = pcie
        self._gave_pcie: Set[int] = set()

    def begin_run(self) -> None:
        self._gave_pcie = set()

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        key = sample_key(device)
        sampler = self._samplers.get(key)
        if sampler is None:
            sampler = self._samplers[key] = GpmSampler(device.parent or device, key[1], self._pcie)
        try:
            values = sampler.read()
        except CannotAnswer:
            return []
        if self._pcie and GpmMetric.PCIE_TX_PER_SEC in values:
            self._gave_pcie.add(device.index)
        found = [(GPM_SERIES[metric], value) for metric, value in values.items()]
        if found:
            found.append((ACTIVITY_SOURCE, "gpm"))
        return found

    def gave_pcie(self, device: NvmlDevice) -> bool:
        """Whether this run's sample of the whole GPU gave its PCIe throughput."""
        return device.index in self._gave_pcie

    def forget(self) -> None:
        for sampler in self._samplers.values():
            sampler.close()
        self._samplers = {}
