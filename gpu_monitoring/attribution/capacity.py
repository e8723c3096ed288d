"""Where each GPU-hour goes: to the workloads that hold a share of a GPU, or to capacity nobody holds,
and what the node pays for and cannot use at all.

A GPU is sold in the grain it is shared: whole, in MIG slices, or in the replicas a device plugin
advertises. A workload's `gpus` is its share in that grain, so what its GPU's shares leave over is
capacity nobody holds (a free slice, a free replica, a GPU given to no one) and idle at its share of
the price. Every figure is a sum of the same parts: a GPU's price = its workloads' costs + its
unallocated capacity's, and its idle cost = its idle workloads' costs + that same capacity's.
"""

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from gpu_monitoring.attribution.workloads import Workload
from gpu_monitoring.node.driver_gpus import nvml_bus_id
from gpu_monitoring.node.pci import PASSED_TO_VM
from gpu_monitoring.node.pci_models import model_of
from gpu_monitoring.snapshot import Device, Snapshot

PriceOf = Callable[[Optional[str]], Optional[float]]  # a GPU model's price per hour, where one is configured
# Shares are sums of fractions (sevenths of a MIG GPU, replicas): what is left below this is rounding.
_ROUNDING = 1e-9


@dataclass
class GpuShares:
    """How much of one GPU its workloads hold, in GPU-equivalents, and how much of that is idle."""

    held: float = 0.0
    held_idle: float = 0.0

    @property
    def unallocated(self) -> float:
        left = 1.0 - self.held
        return left if left > _ROUNDING else 0.0

    @property
    def idle(self) -> float:
        """The GPU-equivalents idle: idle workloads' shares and the capacity nobody holds."""
        return self.held_idle + self.unallocated


@dataclass(frozen=True)
class Unusable:
    """A GPU the node has and cannot use: on the PCI bus and not listed by NVML, or expected and not found."""

    model: Optional[str]  # the product it would be, where its PCI device ID or its peers tell
    price: Optional[float]
    address: Optional[str] = None  # its PCI address; None for one `expected_gpus` misses


def shares(devices: List[Device], found: List[Workload]) -> Dict[int, GpuShares]:
    by_gpu = {device.index: GpuShares() for device in devices}
    for workload in found:
        part = by_gpu[workload.target[0]]
        part.held += workload.gpus
        part.held_idle += workload.gpus if workload.idle else 0.0
    return by_gpu


def unusable(snapshot: Snapshot, expected_gpus: Optional[int], price_of: PriceOf) -> List[Unusable]:
    """The GPUs on this host's PCI bus (not those passed to virtual machines) that NVML does not list,
    then as many more as `expected_gpus` still misses. A missing GPU is priced as the model its PCI
    device ID names: the model of a listed GPU of the same ID, else the product that ID is, else the
    node's most common model."""
    listed = {nvml_bus_id(d.pci_bus_id): d for d in snapshot.devices if d.pci_bus_id}
    functions = [f for f in snapshot.node.pci_functions or () if f.kind == "gpu" and f.driver != PASSED_TO_VM]
    by_id = {f.device_id: listed[nvml_bus_id(f.address)].name for f in functions if nvml_bus_id(f.address) in listed}
    common = _most_common([d.name for d in snapshot.devices])
    missing = [f for f in functions if nvml_bus_id(f.address) not in listed]
    found = [_priced(by_id.get(f.device_id) or model_of(f.device_id) or common, price_of, f.address) for f in missing]
    short = (expected_gpus or 0) - len(snapshot.devices) - len(missing)
    return found + [_priced(common, price_of)] * max(0, short)


def _priced(model: Optional[str], price_of: PriceOf, address: Optional[str] = None) -> Unusable:
    return Unusable(model, price_of(model), address)


def _most_common(models: List[Optional[str]]) -> Optional[str]:
    known = Counter(model for model in models if model)
    return known.most_common(1)[0][0] if known else None
