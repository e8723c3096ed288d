"""Compute and MPS-client processes on a GPU or MIG instance: memory, engine use, name, owner."""

import logging
from typing import Dict, List, Optional, Set, Tuple

from gpu_monitoring.collectors.base import Collector, Fields, sample_key
from gpu_monitoring.collectors.series import SeriesValue, fact, gauge
from gpu_monitoring.metrics.names import PROCESSES_COUNT
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.node.cgroup_paths import CgroupPaths
from gpu_monitoring.node.process_owners import ProcessOwners
from gpu_monitoring.node.procfs import ProcFault, fault_of
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.errors import CannotAnswer
from gpu_monitoring.nvml.processes import Listed, Usage
from gpu_monitoring.snapshot import Process

log = logging.getLogger(__name__)

SampleKey = Tuple[int, Optional[int]]
# MPS clients exist only while an MPS server runs, and the server is a compute process of its own
# (`comm` is the binary's name cut to 15 characters): the MPS query is asked only where the compute
# list holds a process that may be it, named so or of a name that could not be read.
MPS_SERVER = "nvidia-cuda-mps"
_IDLE: Usage = (0.0, 0.0, 0.0, 0.0)
COUNT, PROCESSES = gauge(PROCESSES_COUNT), fact("processes")


class Processes(Collector):
    """Every process NVML lists, with its engine use since the last run. Names and owners
    (container, pod, Slurm job) come from `<proc_root>/<pid>`; a process that exits between
    NVML's list and that read is kept without them. With a `sysfs_root`, the host's path of its
    workload's cgroup too (`Process.cgroup`, under the sysfs root's fs/cgroup).
    """

    name = "processes"

    def __init__(
        self, proc_root: Optional[str] = "/proc", profile: Profile = EVERYTHING, sysfs_root: Optional[str] = None
    ):
        super().__init__(profile)
        self.proc_root = proc_root
        self._since: Dict[SampleKey, int] = {}
        self._listing: Dict[SampleKey, bool] = {}  # whether each device's latest list held a process
        self._faults = ProcFaults()
        cgroup_of = CgroupPaths(sysfs_root).workload if sysfs_root else None
        self._owners = ProcessOwners(proc_root, cgroup_of) if proc_root else None

    def begin_run(self) -> None:
        self._faults.end_run()
        if self._owners is not None:
            self._owners.new_run()

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        key = sample_key(device)
        try:
            found = self._processes(device.compute_processes(), "compute")
        except CannotAnswer:
            self._listing.pop(key, None)
            return []
        self._listing[key] = bool(found)
        if any(map(_may_be_mps_server, found)):
            found = _with_mps_clients(found, self._mps_clients(device))
        usage = self._utilization(device, key, fields.timestamp_us, busy=bool(found))
        if usage is not None:
            for process in found:
                # A process with no sample since the last run ran no kernel: 0, not unknown. But
                # an MPS client's kernels run in the MPS server, sampled for all its clients.
                sample = usage.get(process.pid, None if process.kind == "mps" else _IDLE)
                if sample is not None:
                    (process.sm_utilization, process.memory_utilization, process.encoder_utilization,
                     process.decoder_utilization) = sample
        return [(COUNT, len({process.pid for process in found})), (PROCESSES, found)]

    def listed_any(self, device: NvmlDevice) -> Optional[bool]:
        """Whether the device's latest process list (this run's, once this collector has run) held a
        process; None where it has not been listed this session or could not be."""
        return self._listing.get(sample_key(device))

    def _mps_clients(self, device: NvmlDevice) -> List[Process]:
        try:
            return self._processes(device.mps_clients(), "mps")
        except CannotAnswer:
            return []

    def _processes(self, listed: List[Listed], kind: str) -> List[Process]:
        """NVML's list as snapshot processes, each named and owned as the proc root tells."""
        found = []
        for pid, memory, gpu_instance, compute_instance in listed:
            process = Process(pid=pid, used_memory=memory, kind=kind,
                              gpu_instance_id=gpu_instance, compute_instance_id=compute_instance)
            self._set_owner(process)
            found.append(process)
        return found

    def _utilization(
        self, device: NvmlDevice, key: SampleKey, timestamp_us: int, busy: bool
    ) -> Optional[Dict[int, Usage]]:
        """Usage by pid since the last run; None where the device has no per-process sampling.

        A device that lists no process is not asked: it has no process to tell about. Its samples
        since the last run (a process that ended meanwhile) are skipped by moving `since` to this
        run's field timestamp, NVML's clock like the samples', so that processes starting later
        are measured from this run on, as on a device asked every run.
        """
        if not busy:
            self._since[key] = max(self._since.get(key, 0), timestamp_us)
            return None
        answer = device.process_utilization(self._since.get(key, 0))
        if answer is None:
            return None
        usage, self._since[key] = answer
        return usage

    def _set_owner(self, process: Process) -> None:
        if self._owners is None:
            return
        try:
            identity = self._owners.identify(process.pid)
        except OSError as e:
            self._faults.saw(fault_of(self.proc_root, process.pid, e))
            return
        process.name = identity.name
        if identity.error is not None:
            self._faults.saw(fault_of(self.proc_root, process.pid, identity.error))
        owner = identity.owner
        if owner is not None:
            process.container_id, process.pod_uid, process.slurm = owner.container_id, owner.pod_uid, owner.slurm
            process.cgroup = owner.cgroup

    def forget(self) -> None:
        self._since = {}
        self._listing = {}


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


def _with_mps_clients(compute: List[Process], clients: List[Process]) -> List[Process]:
    """One entry per process: a real driver lists each MPS client among the compute processes
    too (nvidia-smi's "M+C"), and it is an MPS client."""
    client_pids = {client.pid for client in clients}
    return [process for process in compute if process.pid not in client_pids] + clients


def _may_be_mps_server(process: Process) -> bool:
    return process.name is None or process.name.startswith(MPS_SERVER)
