"""Compute and MPS-client processes on a GPU or MIG instance: memory, engine use, name, owner."""

import logging
from typing import Dict, Optional, Set, Tuple

from ..kube.procfs import ProcFault, fault_of
from ..nvml.device import Device
from ..nvml.errors import CannotAnswer
from ..snapshot import Process
from .base import Collector, Fields, sample_key
from .owners import ProcessOwners

log = logging.getLogger(__name__)


class Processes(Collector):
    """Every process NVML lists, with its engine use since the last run. Names and owners
    (container, pod, Slurm job) come from `<proc_root>/<pid>`; a process that exits between
    NVML's list and that read is kept without them.
    """

    name = "processes"

    def __init__(self, proc_root: Optional[str] = "/proc"):
        self.proc_root = proc_root
        self._since: Dict[Tuple[int, Optional[int]], int] = {}
        self._faults = ProcFaults()
        self._collected: Set[Tuple[int, Optional[int]]] = set()
        self._owners = ProcessOwners(proc_root) if proc_root else None

    def collect(self, device: Device, fields: Fields, out) -> None:
        self._count_run(sample_key(device))
        try:
            found = [Process(**p) for p in device.processes()]
        except CannotAnswer:
            return
        out.metrics["processes.count"] = len({p.pid for p in found})
        usage = self._utilization(device)
        for process in found:
            if usage is not None:
                self._set_usage(process, usage.get(process.pid, {}))
            self._set_owner(process)
        out.processes = found

    def _count_run(self, key: Tuple[int, Optional[int]]) -> None:
        # Collectors hear of devices, not of runs: a device seen again means a new run began.
        if key in self._collected:
            self._faults.end_run()
            if self._owners is not None:
                self._owners.new_run()
            self._collected = set()
        self._collected.add(key)

    def _utilization(self, device: Device) -> Optional[Dict[int, Dict[str, float]]]:
        """Usage by pid since the last run; None where the device has no per-process sampling."""
        key = sample_key(device)
        try:
            usage, self._since[key] = device.process_utilization(self._since.get(key, 0))
        except CannotAnswer:
            return None
        return usage

    @staticmethod
    def _set_usage(process: Process, usage: Dict[str, float]) -> None:
        # A process with no sample since the last run ran no kernel: 0, not unknown.
        process.sm_utilization = usage.get("sm", 0.0)
        process.memory_utilization = usage.get("memory", 0.0)
        process.encoder_utilization = usage.get("encoder", 0.0)
        process.decoder_utilization = usage.get("decoder", 0.0)

    def _set_owner(self, process: Process) -> None:
        if self._owners is None:
            return
        try:
            self._read_owner(process)
        except OSError as e:
            self._faults.saw(fault_of(self.proc_root, process.pid, e))

    def _read_owner(self, process: Process) -> None:
        identity = self._owners.identify(process.pid)
        process.name, owner = identity.name, identity.owner
        if identity.error is not None:
            raise identity.error
        if owner is not None:
            process.container_id, process.pod_uid, process.slurm = owner.container_id, owner.pod_uid, owner.slurm

    def forget(self) -> None:
        self._since = {}


class ProcFaults:
    """Faults reading the proc root, logged when each begins and when it ends: a missing mount
    fails every process in every run, and a log line for each would bury everything else."""

    def __init__(self) -> None:
        self._active: Dict[Tuple[str, int], ProcFault] = {}
        self._seen: Set[Tuple[str, int]] = set()

    def saw(self, fault: ProcFault) -> None:
        self._seen.add(fault.key)
        if fault.key not in self._active:
            self._active[fault.key] = fault
            log.warning("%s: those processes are reported without their name or owner", fault)

    def end_run(self) -> None:
        for key in set(self._active) - self._seen:
            log.info("%s no longer: process names and owners are read again", self._active.pop(key))
        self._seen = set()
