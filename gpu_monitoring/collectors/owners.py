"""Who owns a GPU process (container, pod, Slurm job), read from the proc root once per process.

A process's cgroup and starting environment are set before it runs its program and stay, so
they are read when a process is first seen, not every run. A pid alone does not name a process
once the kernel reuses it: each run reads the process's start time to tell a new process from
an old one, one read in place of the cgroup read it saves.
"""

import logging
from dataclasses import replace
from typing import Dict, Optional, Tuple

from ..kube.procfs import ProcessOwner, environment, process_owner, real_uid, start_time, with_environment
from ..snapshot import SlurmJob

log = logging.getLogger(__name__)

# Exited processes are never asked about again; past this many, the oldest half is forgotten.
_MAX_KNOWN = 4096


class ProcessOwners:
    def __init__(self, proc_root: str):
        self.proc_root = proc_root
        self._known: Dict[int, Tuple[int, ProcessOwner]] = {}
        self._environ_unreadable = False

    def owner(self, pid: int) -> Optional[ProcessOwner]:
        """The owner of process `pid`, None when it exited; raises as `process_owner` does."""
        started = start_time(self.proc_root, pid)
        known = self._known.get(pid)
        if known is not None and started is not None and known[0] == started:
            return known[1]
        owner = self._read(pid)
        if owner is not None and started is not None:
            self._remember(pid, started, owner)
        return owner

    def _read(self, pid: int) -> Optional[ProcessOwner]:
        owner = process_owner(self.proc_root, pid)
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

    def _remember(self, pid: int, started: int, owner: ProcessOwner) -> None:
        if len(self._known) >= _MAX_KNOWN:
            for stale in list(self._known)[: _MAX_KNOWN // 2]:
                del self._known[stale]
        self._known[pid] = (started, owner)
