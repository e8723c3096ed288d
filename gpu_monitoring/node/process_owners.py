"""Who a GPU process is (name) and who owns it (container, pod, Slurm job), from the proc root.

A process's cgroup and starting environment are set before it runs its program and stay, so
they are read when a process is first seen, not every run, and so is its name (one tag value for
the life of the process). A pid alone does not name a process once the kernel reuses it: a
process is known by its pid and start time (from `stat`), and between runs by its directory
under the proc root, which the kernel makes anew for a new process. So a process seen before
costs one `stat` call of its directory a run and no file read; its files are read again only
when that directory is another (a reused pid, or the kernel having dropped the directory from
its cache, when the start time tells it is the same process after all).
"""

import logging
from dataclasses import dataclass, replace
from typing import Callable, Dict, Optional, Tuple

from gpu_monitoring.node.procfs import (
    ProcessOwner,
    ProcessStat,
    environment,
    process_directory,
    process_owner,
    process_stat,
    real_uid,
    with_environment,
)
from gpu_monitoring.snapshot import SlurmJob

log = logging.getLogger(__name__)

# Exited processes are never asked about again; past this many, the oldest half is forgotten.
_MAX_KNOWN = 4096


@dataclass(frozen=True)
class Identity:
    """A process as one run sees it: its name (None when it exited), its owner (None when unknown)
    and, when its owner could not be read, why (the name is still good)."""

    name: Optional[str]
    owner: Optional[ProcessOwner]
    error: Optional[OSError] = None


@dataclass(frozen=True)
class _Known:
    directory: Tuple[int, int]  # process_directory's answer
    start_time: int
    identity: Identity


class ProcessOwners:
    """`cgroup_of`, where given, makes the host's path of a process's workload cgroup from the text of
    its `cgroup` file (node.cgroups.CgroupPaths.workload): read with its owner, once per process."""

    def __init__(self, proc_root: str, cgroup_of: Optional[Callable[[str], Optional[str]]] = None):
        self.proc_root = proc_root
        self.cgroup_of = cgroup_of
        self._known: Dict[int, _Known] = {}
        self._this_run: Dict[int, Identity] = {}
        self._environ_unreadable = False

    def new_run(self) -> None:
        """Forget what this run saw: a process is read once per run, however many GPUs list it."""
        self._this_run = {}

    def identify(self, pid: int) -> Identity:
        """Process `pid`'s name and owner, read once per run. Raises OSError as `process_stat` does;
        an owner that cannot be read is the identity's `error`, its name kept."""
        found = self._this_run.get(pid)
        if found is None:
            found = self._this_run[pid] = self._identify(pid)
        return found

    def _identify(self, pid: int) -> Identity:
        directory = process_directory(self.proc_root, pid)
        if directory is None:
            return Identity(None, None)  # it exited since NVML listed it
        known = self._known.get(pid)
        if known is not None and known.directory == directory:
            return known.identity
        stat = process_stat(self.proc_root, pid)
        started = stat.start_time if stat is not None else None
        if known is not None and started is not None and known.start_time == started:
            self._known[pid] = replace(known, directory=directory)
            return known.identity
        try:
            owner = self._read(pid)
        except OSError as e:
            return Identity(_name(stat), None, e)
        identity = Identity(_name(stat), owner)
        if owner is not None and started is not None:
            self._remember(pid, _Known(directory, started, identity))
        return identity

    def _read(self, pid: int) -> Optional[ProcessOwner]:
        owner = process_owner(self.proc_root, pid, self.cgroup_of)
        if owner is None or owner.slurm is None:
            return owner
        return replace(owner, slurm=self._job_details(pid, owner.slurm))

    def _job_details(self, pid: int, job: SlurmJob) -> SlurmJob:
        if job.uid is None:  # cgroup v2 paths name no user: the process's own UID is the job's
            job = replace(job, uid=real_uid(self.proc_root, pid))
        try:
            env = environment(self.proc_root, pid)
        except OSError as e:
            self._say_environ_unreadable(pid, e)
            return job
        return with_environment(job, env or {})

    def _say_environ_unreadable(self, pid: int, error: OSError) -> None:
        # Expected of an Agent that is neither root nor holds CAP_SYS_PTRACE: the job is still known.
        if not self._environ_unreadable:
            log.info(
                "cannot read the environment of process %d under %s (%s): Slurm job names, partitions, "
                "accounts and users are left out where that is so; reading other users' environments "
                "needs CAP_SYS_PTRACE (root has it unless dropped)", pid, self.proc_root, error,
            )
            self._environ_unreadable = True

    def _remember(self, pid: int, known: _Known) -> None:
        if len(self._known) >= _MAX_KNOWN:
            for stale in list(self._known)[: _MAX_KNOWN // 2]:
                del self._known[stale]
        self._known[pid] = known


def _name(stat: Optional[ProcessStat]) -> Optional[str]:
    return stat.name if stat is not None else None
