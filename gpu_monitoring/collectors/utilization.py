"""Engine utilization (NVML sampling) and GPM profiling metrics (Hopper and later)."""

from typing import Dict, List, Optional, Set, Tuple

from gpu_monitoring.collectors.base import Collector, Fields, sample_key
from gpu_monitoring.collectors.series import SeriesValue, fact, gauge
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.errors import CannotAnswer
from gpu_monitoring.nvml.gpm import GPM_METRICS, PCIE_METRICS, GpmSampler

UTILIZATION_GPU = gauge("utilization.gpu")
UTILIZATION_MEMORY = gauge("utilization.memory")
UTILIZATION_ENCODER = gauge("utilization.encoder")
UTILIZATION_DECODER = gauge("utilization.decoder")
GPM_SERIES = {name: gauge(name) for name in (*GPM_METRICS, *PCIE_METRICS)}
ACTIVITY_SOURCE = fact("activity_source")


class Utilization(Collector):
    name = "utilization"

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        found = []
        rates = device.utilization_rates()
        if rates is not None:
            found += [(UTILIZATION_GPU, rates[0]), (UTILIZATION_MEMORY, rates[1])]
        if self.wants(UTILIZATION_ENCODER):
            found.append((UTILIZATION_ENCODER, device.encoder_utilization()))
        if self.wants(UTILIZATION_DECODER):
            found.append((UTILIZATION_DECODER, device.decoder_utilization()))
        return found


class Gpm(Collector):
    """One sampler per GPU, or per GPU instance of a MIG device, kept across runs. A whole GPU's
    sample gives its PCIe throughput too, for the pcie collector (where that one runs), which asks
    `gave_pcie` whether this run's did."""

    name = "gpm"

    def __init__(self, pcie: bool = True) -> None:
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
        if self._pcie and "pcie.throughput.tx" in values:
            self._gave_pcie.add(device.index)
        found = [(GPM_SERIES[name], value) for name, value in values.items()]
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
