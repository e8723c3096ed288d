"""The Slurm jobs on the node and the GPUs Slurm gave each, whether or not any of a job's processes runs
on them, from the host's cgroup tree (`<sysfs_root>/fs/cgroup`, where the host's /sys/fs/cgroup is).

slurmstepd makes a cgroup per job, laid out as procfs.py reads it in processes' cgroup files
(https://slurm.schedmd.com/cgroup_v2.html, "Hierarchy overview", for cgroup v2); the node name appears
with several slurmd per host:

    cgroup v2   system.slice/[<nodename>_]slurmstepd.scope/job_<id>/step_<step>/{slurm,user/task_<n>}
    cgroup v1   <controller>/slurm[_<nodename>]/uid_<uid>/job_<id>/step_<step>[/task_<n>]

with proctrack/cgroup in the freezer hierarchy and task/cgroup in cpuset, memory and devices.

A job's GPUs, by NVML minor number (/dev/nvidia<minor>):

- cgroup v1 with ConstrainDevices: the job's `devices.list` (kernel Documentation/admin-guide/cgroup-v1/
  devices.rst): one allowed device a line, `<type> <major>:<minor> <access>`, `*` for any number. GPUs are
  char major 195; minor 255 is nvidiactl and 254 nvidia-modeset, regular GPUs 0 to 247
  (open-gpu-kernel-modules, kernel-open/common/inc/nv-chardev-numbers.h). A cgroup that allows by default
  shows the one line `a *:* rwm` whatever it denies (security/device_cgroup.c, devcgroup_seq_show), so
  the file then tells nothing of GPUs.
- Otherwise (cgroup v2, where Slurm constrains devices with an eBPF program and no file shows them): the
  environment of one of the job's processes, `SLURM_JOB_GPUS`, else `SLURM_STEP_GPUS` (sbatch and salloc
  man pages, "OUTPUT ENVIRONMENT VARIABLES": the global GPU IDs allocated, not relative to any device
  cgroup; a list such as `0-3,5`). `environ` is readable only with CAP_SYS_PTRACE (or as root or the
  job's user): without it a job's GPUs are unknown, and that is said once.

The same environment gives the job's name, partition, account and user (procfs.with_environment).

Cost per run: a listing of each slurmstepd scope (cgroup v2), or of the `slurm` directory and of each of
its `uid_<uid>` directories (cgroup v1); on a node without Slurm, a search for them one run in
SEARCH_EVERY. A job's GPUs and names are read once, when it is first seen (a walk of at most MAX_LEVELS
cgroup levels below it and MAX_CGROUPS cgroups, and up to MAX_PIDS environments); a job whose cgroups
hold no process yet is read again on the next run.
"""

import logging
import os
from dataclasses import dataclass
from itertools import islice
from typing import Dict, Iterator, List, Optional, Tuple

from gpu_monitoring.node.cgroup_paths import CGROUP_MOUNT
from gpu_monitoring.node.kernel_files import read_value
from gpu_monitoring.node.procfs import environment, real_uid, with_environment
from gpu_monitoring.snapshot import SlurmAllocation, SlurmJob

log = logging.getLogger(__name__)

V2_PARENT = "system.slice"
V2_SCOPE_SUFFIX = "slurmstepd.scope"
# The v1 hierarchies where Slurm makes its jobs' cgroups, in the order they are looked in: freezer for
# proctrack/cgroup, devices and cpuset for task/cgroup.
V1_CONTROLLERS = ("freezer", "devices", "cpuset")
NVIDIA_MAJOR = "195"
NVIDIA_MINOR_MAX = 247  # NV_MINOR_DEVICE_NUMBER_REGULAR_MAX; 254 and 255 are the driver's own devices
# job_<id>/step_<step>/user/task_<n>: four levels hold every task of a job on either cgroup version.
MAX_LEVELS = 4
MAX_CGROUPS = 64
MAX_PIDS = 8
# A node without Slurm is looked at again one run in this many (some 2 minutes at a 15 s interval), in case
# slurmd started since: the search costs a listing of system.slice or of three v1 hierarchies.
SEARCH_EVERY = 8
# A devices.list allowing many devices can pass a page; it is read once per job.
MAX_DEVICES_LIST_BYTES = 65536
# Cgroups below a job that hold none of its tasks: slurmstepd's own (cgroup v2, each step's `slurm`).
_NOT_TASKS = ("slurm",)
# The extern step holds processes adopted from ssh sessions, which carry no job environment: looked in last.
_EXTERN_STEP = "step_extern"


@dataclass(frozen=True)
class _JobCgroup:
    job_id: str
    directory: str  # the job's cgroup, where its tasks' cgroups are
    uid: Optional[int]  # from the cgroup v1 path
    devices_list: Optional[str]  # the cgroup v1 devices controller's file for the job


@dataclass(frozen=True)
class _Root:
    version: int
    directory: str  # a slurmstepd scope (v2), or a hierarchy's slurm[_<nodename>] directory (v1)
    devices: Optional[str]  # the same directory in the v1 devices hierarchy


# Where a job's cgroup is: its root, its `uid_<uid>` directory (cgroup v1; "" on v2) and its own name.
_Place = Tuple[_Root, str, str]


class SlurmJobReader:
    """Reads the node's Slurm jobs and their GPUs, run after run (module docstring)."""

    def __init__(self, sysfs_root: str, proc_root: Optional[str]) -> None:
        self._cgroups = os.path.join(sysfs_root, *CGROUP_MOUNT)
        self._proc_root = proc_root
        self._roots: List[_Root] = []
        self._search_in = 0  # runs until the Slurm roots are looked for again
        self._jobs: Dict[str, SlurmAllocation] = {}
        self._last: List[SlurmAllocation] = []
        self._told_unreadable = False

    def read(self) -> Optional[List[SlurmAllocation]]:
        """The jobs on the node with their GPUs (an empty list where a job's are unknown), by job ID;
        None where the host's cgroup tree has no Slurm directory at all."""
        listed = self._list_jobs()
        if listed is None:
            self._jobs, self._last = {}, []
            return None
        if listed.keys() != self._jobs.keys():
            known = {}
            for job_id, place in listed.items():
                allocation = self._jobs.get(job_id) or self._first_read(_job_cgroup(job_id, *place))
                if allocation is not None:
                    known[job_id] = allocation
            self._jobs = known  # a job that went is dropped here
            self._last = sorted(known.values(), key=lambda allocation: int(allocation.job.job_id))
        return list(self._last)

    def _list_jobs(self) -> Optional[Dict[str, _Place]]:
        """The job cgroups under the Slurm roots found before. The roots are looked for again at once when
        one went (slurmd restarted), and one run in SEARCH_EVERY on a node where none was found."""
        if self._roots:
            jobs = _jobs_under(self._roots)
            if jobs is not None:
                return jobs
            self._search_in = 0
        if self._search_in > 0:
            self._search_in -= 1
            return None
        self._roots = _find_roots(self._cgroups)
        if not self._roots:
            self._search_in = SEARCH_EVERY - 1
            return None
        return _jobs_under(self._roots)

    def _first_read(self, job: _JobCgroup) -> Optional[SlurmAllocation]:
        """The job's allocation; None, to be read again next run, while its cgroups hold no process yet
        (slurmstepd makes them before it starts the tasks)."""
        pid, env = self._job_environment(job)
        if pid is None:
            return None
        uid = job.uid if job.uid is not None else self._uid_of(pid)
        minors = _allowed_gpu_minors(job.devices_list) if job.devices_list else None
        if minors is None and env is not None:
            minors = gpu_ids(env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS") or "")
        return SlurmAllocation(with_environment(SlurmJob(job.job_id, uid=uid), env or {}), minors or [])

    def _job_environment(self, job: _JobCgroup) -> Tuple[Optional[int], Optional[Dict[str, str]]]:
        """(a pid of the job, its environment): the first of up to MAX_PIDS whose environment names the
        job; (a pid, None) where none does or environments cannot be read; (None, None) with no process."""
        pids = list(islice(task_pids(job.directory), MAX_PIDS))
        if not pids:
            return None, None
        if not self._proc_root:
            self._tell_unreadable("no proc_root is set")
            return pids[0], None
        for pid in pids:
            try:
                env = environment(self._proc_root, pid)
            except OSError as e:
                self._tell_unreadable(str(e))
                break
            if env is not None and env.get("SLURM_JOB_ID") == job.job_id:
                return pid, env
        return pids[0], None

    def _uid_of(self, pid: int) -> Optional[int]:
        try:
            return real_uid(self._proc_root, pid) if self._proc_root else None
        except OSError:
            return None

    def _tell_unreadable(self, why: str) -> None:
        if not self._told_unreadable:
            self._told_unreadable = True
            log.info("cannot read the environment of Slurm jobs' processes (%s): the GPUs of jobs on cgroup v2 "
                     "and every job's name, user, account and partition are unknown; reading /proc/<pid>/environ "
                     "takes CAP_SYS_PTRACE", why)


def gpu_ids(text: str) -> Optional[List[int]]:
    """The numbers of a Slurm ID list such as `0-3,5`, sorted; None where it is not one (empty, or
    `NoDevFiles`, which older Slurm wrote for GPUs configured without device files).

    Slurm's GPU IDs are taken for NVML minor numbers: the IDs of gres.conf's `File=/dev/nvidia[N]` devices,
    N being the device's minor. Older Slurm wrote the digits of the file name (`dev_num`); later releases
    write the GPU's place in the node's device list, which Slurm keeps in PCI bus order, "the order they
    enumerate on the PCI bus" (SchedMD/slurm, src/plugins/gres/common/gres_common.c, common_gres_set_env).
    The two agree where the driver numbered the GPUs in bus order, as it does when it probes them in that
    order; where they differ, cgroup v1's devices.list, which names minors, is the one exact source."""
    numbers = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return None
        numbers.update(range(int(first), int(last if dash else first) + 1))
    return sorted(numbers)


def device_list_gpus(text: str) -> Optional[List[int]]:
    """The GPU minor numbers a cgroup v1 `devices.list` allows; None where it allows every NVIDIA device
    (`a *:* rwm`, `c *:* rwm`, `c 195:* rwm`), the cgroup constraining no GPU."""
    minors = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 3:
            continue
        kind, (major, _, minor) = fields[0], fields[1].partition(":")
        if kind == "a" or (kind == "c" and major in (NVIDIA_MAJOR, "*") and minor == "*"):
            return None
        if kind == "c" and major == NVIDIA_MAJOR and minor.isdigit() and int(minor) <= NVIDIA_MINOR_MAX:
            minors.add(int(minor))
    return sorted(minors)


def task_pids(job_directory: str) -> Iterator[int]:
    """The pids in `cgroup.procs` of the cgroups below a job's, level by level, at most MAX_LEVELS deep
    and MAX_CGROUPS cgroups; slurmstepd's own cgroups left out and the extern step last."""
    level, budget = [job_directory], MAX_CGROUPS
    for depth in range(MAX_LEVELS):
        level = level[:budget]
        budget -= len(level)
        below: List[str] = []
        for directory in level:
            yield from _procs(directory)
            if depth + 1 < MAX_LEVELS:
                below.extend(_task_cgroups(directory))
        level = below


def _procs(directory: str) -> Iterator[int]:
    # A list cut at the helper's page holds hundreds of pids before the cut: far more than are tried.
    for token in (read_value(os.path.join(directory, "cgroup.procs")) or "").split():
        if token.isdigit():
            yield int(token)


def _task_cgroups(directory: str) -> List[str]:
    try:
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    names = sorted((name for name in names if name not in _NOT_TASKS), key=lambda name: name == _EXTERN_STEP)
    return [os.path.join(directory, name) for name in names]


def _allowed_gpu_minors(path: str) -> Optional[List[int]]:
    # Not read_value: a whitelist of many devices can pass its one page, and GPUs come last in it.
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_DEVICES_LIST_BYTES).decode("ascii", "replace")
    except OSError:
        return None  # no devices hierarchy, or Slurm does not constrain devices
    return device_list_gpus(text)


def _find_roots(cgroups: str) -> List[_Root]:
    """The slurmstepd scopes (cgroup v2), or else the slurm[_<nodename>] directories of the first v1
    hierarchy that has any."""
    parent = os.path.join(cgroups, V2_PARENT)
    scopes = [name for name in _listing(parent) or [] if name.endswith(V2_SCOPE_SUFFIX)]
    if scopes:
        return [_Root(2, os.path.join(parent, name), None) for name in sorted(scopes)]
    for controller in V1_CONTROLLERS:
        names = [name for name in _listing(os.path.join(cgroups, controller)) or [] if _is_v1_root(name)]
        if names:
            return [_Root(1, os.path.join(cgroups, controller, name), os.path.join(cgroups, "devices", name))
                    for name in sorted(names)]
    return []


def _is_v1_root(name: str) -> bool:
    return name == "slurm" or name.startswith("slurm_")


def _jobs_under(roots: List[_Root]) -> Optional[Dict[str, _Place]]:
    """{job ID: where its cgroup is} under each root, by names alone; None when a root cannot be listed
    any more."""
    jobs: Dict[str, _Place] = {}
    for root in roots:
        users = [""] if root.version == 2 else _listing(root.directory)
        if users is None:
            return None
        for user in users:
            if user and not (user.startswith("uid_") and user[len("uid_"):].isdigit()):
                continue
            names = _listing(os.path.join(root.directory, user) if user else root.directory)
            if names is None and not user:
                return None
            jobs.update((name[len("job_"):], (root, user, name)) for name in names or () if _is_job(name))
    return jobs


def _is_job(name: str) -> bool:
    return name.startswith("job_") and name[len("job_"):].isdigit()


def _job_cgroup(job_id: str, root: _Root, user: str, name: str) -> _JobCgroup:
    if root.version == 2:
        return _JobCgroup(job_id, os.path.join(root.directory, name), None, None)
    devices = os.path.join(root.devices, user, name, "devices.list") if root.devices else None
    return _JobCgroup(job_id, os.path.join(root.directory, user, name), int(user[len("uid_"):]), devices)


def _listing(directory: str) -> Optional[List[str]]:
    try:
        return os.listdir(directory)
    except OSError:
        return None
