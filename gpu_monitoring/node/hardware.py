"""The node around the GPUs, read once a run into the snapshot's node: the boot ID, the NVIDIA
functions on the PCI bus, the GPUs in the driver's record and the InfiniBand and RoCE ports.

Cost per run (`scripts/bench.py --sysfs`): one listing of bus/pci/devices and a readlink per NVIDIA
function (a function's identity is read once), one listing of the driver's GPU directory, and per
port its state, physical state, rate and counters; no NVML call.
"""

import time
from functools import cached_property
from typing import Callable, Iterable, Optional

from gpu_monitoring.node.boot import read_boot_id
from gpu_monitoring.node.cgroups import WorkloadCgroups
from gpu_monitoring.node.driver_gpus import driver_gpu_bus_ids
from gpu_monitoring.node.infiniband import PortReader
from gpu_monitoring.node.pci import PciReader, SysfsUnavailable
from gpu_monitoring.node.slurm_jobs import SlurmJobReader
from gpu_monitoring.snapshot import Node, Process


class HardwareReader:
    def __init__(self, sysfs_root: str, proc_root: Optional[str], clock: Callable[[], float] = time.time) -> None:
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root
        self.clock = clock
        self._pci = PciReader(sysfs_root)
        self._ports = PortReader(sysfs_root)
        self._slurm = SlurmJobReader(sysfs_root, proc_root)
        self._workloads = WorkloadCgroups(sysfs_root, proc_root, clock)

    @cached_property
    def _boot_id(self) -> Optional[str]:
        """Read once: a reboot ends this process, so the boot ID it saw first holds for its life."""
        return read_boot_id(self.proc_root)

    def read_into(self, node: Node) -> None:
        node.read_at = self.clock()
        node.boot_id = self._boot_id
        node.driver_gpus = driver_gpu_bus_ids(self.proc_root)
        node.network_ports = self._ports.read()
        node.slurm_allocations = self._slurm.read()
        try:
            node.pci_functions = self._pci.read()
        except SysfsUnavailable as e:
            node.pci_functions, node.sysfs_problem = None, str(e)

    def read_workloads(self, node: Node, processes: Iterable[Process]) -> None:
        """The cgroups of the workloads that run `processes` (node.cgroups: node.cgroups.WorkloadCgroups)
        and the host's CPU count; each process's state is set as read this run."""
        node.cgroups = self._workloads.read(processes)
        node.cpu_cores = self._workloads.cpu_cores
