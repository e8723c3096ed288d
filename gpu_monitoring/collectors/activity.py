"""Engine utilization (NVML sampling) and GPM profiling metrics (Hopper and later)."""

from typing import Dict, Optional, Tuple

from ..nvml.device import Device
from ..nvml.errors import CannotAnswer
from ..nvml.gpm import GpmSampler
from .base import Collector, Fields, put, sample_key


class Utilization(Collector):
    name = "utilization"

    def collect(self, device: Device, fields: Fields, out) -> None:
        rates = device.utilization_rates()
        if rates is not None:
            out.metrics["utilization.gpu"], out.metrics["utilization.memory"] = rates
        if self.wants("utilization.encoder"):
            put(out.metrics, "utilization.encoder", device.encoder_utilization())
        if self.wants("utilization.decoder"):
            put(out.metrics, "utilization.decoder", device.decoder_utilization())


class Gpm(Collector):
    """One sampler per GPU, or per GPU instance of a MIG device, kept across runs. A whole GPU's
    sample gives its PCIe throughput too, for the pcie collector (where that one runs)."""

    name = "gpm"

    def __init__(self, pcie: bool = True) -> None:
        self._samplers: Dict[Tuple[int, Optional[int]], GpmSampler] = {}
        self._pcie = pcie

    def collect(self, device: Device, fields: Fields, out) -> None:
        key = sample_key(device)
        sampler = self._samplers.get(key)
        if sampler is None:
            sampler = self._samplers[key] = GpmSampler(device.parent or device, key[1], self._pcie)
        try:
            out.metrics.update(sampler.read())
        except CannotAnswer:
            pass

    def forget(self) -> None:
        for sampler in self._samplers.values():
            sampler.close()
        self._samplers = {}
