"""Which container, pod and Slurm job a process belongs to, read from a proc root.

The proc root is the host's /proc (mounted at /host/proc in an Agent container). A process's
`cgroup` file names the cgroup it runs in, and container runtimes name that cgroup after the
container ID, inside a cgroup the kubelet names after the pod UID:

    cgroup v2, systemd driver    0::/kubepods.slice/kubepods-burstable.slice/
                                     kubepods-burstable-pod<uid, "-" as "_">.slice/cri-containerd-<id>.scope
    cgroup v1, cgroupfs driver   4:memory:/kubepods/besteffort/pod<uid>/<id>

Guaranteed pods have no QoS level (`kubepods-pod<uid>.slice`, `/kubepods/pod<uid>`); CRI-O names
containers `crio-<id>[.scope]`, docker `docker-<id>.scope` or `/docker/<id>`.

Container hosts without Kubernetes use the same names outside any pod: docker `docker-<id>.scope`
(in `system.slice`, or a user's `user.slice` when rootless) or `/docker/<id>`; podman
`libpod-<id>.scope[/container]` (in `machine.slice`, or a pod's `machine-libpod_pod_<pod id>.slice`),
or `<unit>.service/libpod-payload-<id>` when split from its conmon as Quadlet units are; nerdctl
`nerdctl-<id>.scope`; containerd's cgroupfs layout `/<namespace>/<id>` (nerdctl's `default`). Only
64-hex IDs are recognised, so a container `ctr run` was given a name by hand reads as the host's.

Slurm puts each job step's processes in a cgroup of its own:

    cgroup v1   <n>:<controller>:/slurm[_<nodename>]/uid_<uid>/job_<id>/step_<step>[/task_<n>]
    cgroup v2   0::/system.slice/[<nodename>_]slurmstepd.scope/job_<id>/step_<step>/user/task_<n>

`<step>` is a number, `batch`, `extern` (processes adopted from ssh sessions) or `interactive`;
the node name appears with several slurmd per host. slurmstepd itself waits in the scope's
`system` cgroup and then runs in the step's `slurm` cgroup: it is no process of the job.
"""

import os
import re
from dataclasses import dataclass, replace
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from gpu_monitoring.snapshot import SlurmJob


@dataclass(frozen=True)
class ProcessOwner:
    """The container and pod a process runs in, both None for a process of the host itself, and
    the Slurm job step it runs in, if any; `cgroup` is the host's path of its workload's cgroup
    (node.cgroups), where it was asked for and found."""

    container_id: Optional[str]
    pod_uid: Optional[str]
    slurm: Optional[SlurmJob] = None
    cgroup: Optional[str] = None


_HOST = ProcessOwner(None, None)

# Pod UIDs are UUIDs, except static pods', which are 32 hex digits (a hash of the manifest).
_UID = r"(?P<uid>[0-9a-f]{8}(?:[-_][0-9a-f]{4}){3}[-_][0-9a-f]{12}|[0-9a-f]{32})"
# The systemd driver may nest kubepods under a root slice (`kubelet-kubepods-...` in kind).
_POD_SLICE = re.compile(r"(?:.+-)?kubepods(?:-besteffort|-burstable)?-pod" + _UID + r"\.slice")
_POD_DIR = re.compile("pod" + _UID)
# A prefix must be a runtime's: a unit such as `backup-<64 hex>.service` is not a container.
_RUNTIME_PREFIX = r"(?:cri-containerd-|crio-|docker-|libpod-(?:payload-)?|nerdctl-)"
_CONTAINER = re.compile(_RUNTIME_PREFIX + r"?(?P<id>[0-9a-f]{64})(?:\.scope)?")
# The per-container monitor of CRI-O and podman: named after the container, yet none of its processes.
_CONMON = re.compile(r"(?:crio|libpod)-conmon-[0-9a-f]{64}(?:\.scope)?")
# cgroup v2 marks the cgroup of an exited, not yet reaped process this way.
_DELETED = " (deleted)"
# What lies below the step tells slurmstepd's own cgroup (`slurm`) from the job's tasks'.
_STEP = r"/job_(?P<job>\d+)(?:/step_(?P<step>[^/]+))?(?P<below>/.*)?$"
_SLURM_V1 = re.compile(r"/slurm(?:_[^/]+)?/uid_(?P<uid>\d+)" + _STEP)
_SLURM_V2 = re.compile(r"/(?:[^/]+_)?slurmstepd\.scope" + _STEP)
# What the job's processes' environments add to their job; the rest of the environment is not read.
_SLURM_ENVIRONMENT = {
    "SLURM_JOB_NAME": "name",
    "SLURM_JOB_PARTITION": "partition",
    "SLURM_JOB_ACCOUNT": "account",
    "SLURM_JOB_USER": "user",
}


def parse_cgroup(text: str) -> ProcessOwner:
    """The owner named by the contents of `/proc/<pid>/cgroup`, cgroup v1 or v2.

    cgroup v1 lists one line per hierarchy, and some (rdma, the hybrid `0::` line) may stay at
    `/` for a container process, so the first line naming a container wins, then one naming a pod.
    """
    paths = list(_paths(text))
    owners = [_owner_of_path(path) for path in paths]
    with_container = [owner for owner in owners if owner.container_id]
    with_pod = [owner for owner in owners if owner.pod_uid]
    owner = (with_container or with_pod or [_HOST])[0]
    jobs = [job for job in map(_slurm_of_path, paths) if job]
    return replace(owner, slurm=jobs[0]) if jobs else owner


@dataclass(frozen=True)
class ProcFault:
    """Why a file under the proc root could not be read: the same reason for many processes is one fault."""

    proc_root: str
    file: str  # the file of every process that cannot be read, or "" when the proc root itself is missing
    errno: int
    reason: str
    pid: int  # the first process it was seen for

    @property
    def key(self) -> Tuple[str, int]:
        return self.file, self.errno

    def __str__(self) -> str:
        if not self.file:
            return f"proc_root {self.proc_root} does not exist (is the host's /proc mounted there?)"
        where = f"under {self.proc_root} ({self.reason}; first for pid {self.pid})"
        return f"cannot read `{self.file}` of processes {where}"


def fault_of(proc_root: str, pid: int, error: OSError) -> ProcFault:
    """The fault a read under the proc root raised: `process_owner` and `process_stat` raise
    FileNotFoundError only for a missing proc root, other errors for a file that is unreadable
    (no permission, a directory, a symlink loop)."""
    if isinstance(error, FileNotFoundError):
        return ProcFault(proc_root, "", error.errno or 0, error.strerror or str(error), pid)
    file = os.path.basename(error.filename) if isinstance(error.filename, str) else ""
    return ProcFault(proc_root, file or "?", error.errno or 0, error.strerror or str(error), pid)


def process_owner(
    proc_root: str, pid: int, cgroup_of: Optional[Callable[[str], Optional[str]]] = None
) -> Optional[ProcessOwner]:
    """The owner of process `pid`, or None when it exited since it was listed; with `cgroup_of`,
    which makes the host's path of a workload's cgroup from the `cgroup` file's text, its `cgroup`
    too (a process of the host has no workload, so none).

    Two failures are raised rather than read as an exit, for the caller to report once: a
    PermissionError (`cgroup` is world-readable, so it means a proc mount with `hidepid` or a
    security policy) and a FileNotFoundError for a proc root that does not exist (not mounted).
    """
    text = _read(proc_root, pid, "cgroup")
    if text is None:
        return None
    owner = parse_cgroup(text)
    if cgroup_of is None or not (owner.container_id or owner.slurm):
        return owner
    return replace(owner, cgroup=cgroup_of(text))


def workload_path(path: str) -> Optional[str]:
    """`path`, a cgroup path of a process, cut after its workload's own directory: the innermost one
    that names a container (as `parse_cgroup` recognises them), else its Slurm job's `job_<id>`;
    None for a path of neither (the host's processes, slurmstepd's own cgroups)."""
    path = path.removesuffix(_DELETED)
    segments = path.split("/")
    containers = [index for index, segment in enumerate(segments) if _CONTAINER.fullmatch(segment)]
    if containers:
        return "/".join(segments[: containers[-1] + 1])
    if _slurm_of_path(path) is None:
        return None
    found = _SLURM_V1.search(path) or _SLURM_V2.search(path)
    return path[: found.end("job")]


@dataclass(frozen=True)
class ProcessStat:
    """What a process's `stat` says of it: its command name (`comm`, which a process may change)
    and when it started (clock ticks after boot; with the pid it names one process, as a pid alone
    does not once the kernel reuses it). `start_time` is None when the file cannot be parsed."""

    name: str
    start_time: Optional[int]


def process_stat(proc_root: str, pid: int) -> Optional[ProcessStat]:
    """Process `pid`'s name and start time from one read of its `stat`, or None when it exited;
    raises as `process_owner` does."""
    text = _read(proc_root, pid, "stat")
    if text is None:
        return None
    name, fields = stat_fields(text)
    started = int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None
    return ProcessStat(name, started)


def stat_fields(text: str) -> Tuple[str, List[str]]:
    """A `stat` text's command name (field 2) and the fields after it, from the state (field 3) on. The
    name is in parentheses and may hold spaces and ")": the fields follow the last (proc(5))."""
    head, _, rest = text.rpartition(")")
    return head.partition("(")[2], rest.split()


def process_directory(proc_root: str, pid: int) -> Optional[Tuple[int, int]]:
    """Which instance of `<proc_root>/<pid>` this is (inode number and change time), or None when
    the process exited; raises as `process_owner` does. The kernel makes a process's directory
    when it is first looked up and drops it when the process exits, so a pid the kernel reuses
    has another; one `stat` call, with no file to open and no text for the kernel to make."""
    try:
        status = os.stat(os.path.join(proc_root, str(pid)))
    except (FileNotFoundError, ProcessLookupError):
        if not os.path.isdir(proc_root):
            raise
        return None
    return status.st_ino, status.st_ctime_ns


def real_uid(proc_root: str, pid: int) -> Optional[int]:
    """The real UID of process `pid` (first of `status`'s `Uid:` line), or None when it exited."""
    for line in (_read(proc_root, pid, "status") or "").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def environment(proc_root: str, pid: int) -> Optional[Dict[str, str]]:
    """The environment process `pid` started with, or None when it exited.

    Unlike `cgroup`, `environ` is readable only by the process's own user, root, or with
    CAP_SYS_PTRACE, so a PermissionError here is the normal answer to an Agent that is none of these.
    """
    text = _read(proc_root, pid, "environ")
    if text is None:
        return None
    return dict(entry.split("=", 1) for entry in text.split("\0") if "=" in entry)


def with_environment(job: SlurmJob, env: Dict[str, str]) -> SlurmJob:
    """`job` with the name, partition, account and user its process's environment gives."""
    return replace(job, **{field: env[name] for name, field in _SLURM_ENVIRONMENT.items() if env.get(name)})


def _slurm_of_path(path: str) -> Optional[SlurmJob]:
    found = _SLURM_V1.search(path) or _SLURM_V2.search(path)
    if found is None or (found["below"] or "/").split("/")[1] == "slurm":
        return None  # not Slurm's, or slurmstepd in its step's own cgroup
    uid = found.groupdict().get("uid")
    return SlurmJob(job_id=found["job"], step=found["step"], uid=int(uid) if uid else None)


def _paths(text: str) -> Iterator[str]:
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3:
            yield fields[2].removesuffix(_DELETED)


def _owner_of_path(path: str) -> ProcessOwner:
    pod_uid = container_id = None
    monitor = False
    for segment in path.split("/"):
        pod = _POD_SLICE.fullmatch(segment) or _POD_DIR.fullmatch(segment)
        container = _CONTAINER.fullmatch(segment)
        if pod:
            # A pod inside a container (kind, nested runtimes) starts over: that container is a node.
            pod_uid, container_id, monitor = pod["uid"].replace("_", "-"), None, False
        elif container:
            container_id, monitor = container["id"], False
        elif _CONMON.fullmatch(segment):
            container_id, monitor = None, True
    return _HOST if monitor else ProcessOwner(container_id, pod_uid)


def _read(proc_root: str, pid: int, name: str) -> Optional[str]:
    # Processes come and go between listing and reading: a missing file or ESRCH is normal, not worth a log.
    try:
        with open(os.path.join(proc_root, str(pid), name), encoding="utf-8", errors="replace") as f:
            return f.read()
    except ProcessLookupError:
        return None
    except FileNotFoundError:
        if not os.path.isdir(proc_root):
            raise  # a proc root that is not mounted is a configuration error, not every process exiting
        return None
