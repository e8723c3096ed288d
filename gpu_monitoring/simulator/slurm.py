"""A scenario's Slurm jobs: where slurmstepd puts each job's processes, what they inherit, and the job's
cgroups on the host, which show every job on the node whether or not it runs anything on its GPUs.

    slurm:
      cgroup_version: 2             # default; 1 for Slurm's legacy cgroup/v1 plugin
      nodename: gpu-a17             # only where the host runs several slurmd (--enable-multiple-slurmd)
      jobs:
        - id: 48213
          name: llama3-pretrain     # what sbatch/srun export: SLURM_JOB_NAME, SLURM_JOB_USER,
          user: alice               # SLURM_JOB_ACCOUNT, SLURM_JOB_PARTITION
          uid: 1001
          account: nlp
          partition: gpu
          step: "0"                 # default; or batch, extern, interactive
          gpus: [0, 1, 2, 3]        # the scenario's device indices Slurm gave the job
          processes: [51001, 51002] # pids of the scenario's GPU processes, one task each
          cpu_processes:            # the job's processes on no GPU (a batch script's shell), tasks after those
            - {pid: 54410, name: bash}
          cgroup: {cpu_quota: 16}   # what the job's cgroup shows (simulator.cgroup_tree lists the keys)

Each task's environment has SLURM_JOB_GPUS, the job's GPUs by the IDs Slurm gives them (here the devices'
minor numbers, as gres.conf's `File=/dev/nvidia[N]` numbers them), and CUDA_VISIBLE_DEVICES as Slurm sets it
when it constrains devices: 0 to n-1, relative to the allocation (sbatch man page, "OUTPUT ENVIRONMENT
VARIABLES"; Slurm's gres.html, "GPU Management").

`write_slurm_cgroups` writes under the sysfs root's `fs/cgroup` the cgroups `proc_root.slurm_cgroup_text`
names, each task's pid in its `cgroup.procs`, and on cgroup v1 the job's `devices.list` as the devices
controller lists a whitelist (kernel Documentation/admin-guide/cgroup-v1/devices.rst): the devices every job
may use, then its GPUs (char major 195).
"""

from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from gpu_monitoring.simulator.proc_root import slurm_cgroup_text

# Spelled out here rather than taken from the code that reads them, so that a wrong name there fails a test.
_EXPORTED = {"SLURM_JOB_NAME": "name", "SLURM_JOB_USER": "user", "SLURM_JOB_ACCOUNT": "account",
             "SLURM_JOB_PARTITION": "partition"}
_LOGIN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
# What every job may open (/dev/null, zero, full, random, urandom, tty, ptmx, pts/*) and the NVIDIA driver's
# own devices (nvidiactl 195:255, nvidia-modeset 195:254; nvidia-uvm's major is given at load time),
# as a whitelist lists them, before the job's GPUs.
_BASE_DEVICES = ("c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm", "c 5:2 rwm",
                 "c 136:* rwm", "c 195:255 rwm", "c 195:254 rwm", "c 509:0 rwm", "c 509:1 rwm")


def slurm_processes(raw: Mapping[str, Any], minors: Optional[Sequence[int]] = None) -> Dict[int, Dict[str, Any]]:
    """{pid: proc root entries (cgroup text, uid, environ)} of every job's GPU processes. `minors` are the
    scenario's devices' minor numbers by index (the index itself where not given)."""
    return {pid: entry for pid, name, entry in _tasks(raw, minors) if name is None}


def slurm_cpu_processes(raw: Mapping[str, Any], minors: Optional[Sequence[int]] = None) -> List[Dict[str, Any]]:
    """The proc root's processes (pid, name, cgroup text, uid, environ) of every job's `cpu_processes`."""
    return [dict(entry, pid=pid, name=name) for pid, name, entry in _tasks(raw, minors) if name is not None]


def write_slurm_cgroups(cgroup_root: Path, raw: Mapping[str, Any], minors: Optional[Sequence[int]] = None) -> None:
    """Write every job's cgroups under `cgroup_root`: its own, each task's with the pids in `cgroup.procs`,
    and on cgroup v1 its devices.list. Directories are made with exist_ok, beside what other writers put there."""
    procs: Dict[Path, List[int]] = {}
    for job in raw.get("jobs", []):
        for directory in _job_directories(cgroup_root, raw, job):
            directory.mkdir(parents=True, exist_ok=True)
        for pid, _, entry in _job_tasks(raw, job, minors):
            for directory in _cgroups_of(cgroup_root, entry["cgroup"]):
                procs.setdefault(directory, []).append(pid)
        if raw.get("cgroup_version", 2) == 1:
            _write_devices_list(cgroup_root, raw, job, minors)
    for directory, pids in procs.items():
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))


def _tasks(raw: Mapping[str, Any], minors: Optional[Sequence[int]]) -> Iterator[Tuple[int, Optional[str], Dict]]:
    for job in raw.get("jobs", []):
        yield from _job_tasks(raw, job, minors)


def _job_tasks(
    raw: Mapping[str, Any], job: Mapping[str, Any], minors: Optional[Sequence[int]]
) -> Iterator[Tuple[int, Optional[str], Dict]]:
    """(pid, name for a process on no GPU or None, proc root entries) of each task of a job: its GPU
    processes first, then its others."""
    version, nodename = raw.get("cgroup_version", 2), raw.get("nodename")
    tasks = [(pid, None) for pid in job.get("processes", [])]
    tasks += [(process["pid"], process.get("name", "bash")) for process in job.get("cpu_processes", [])]
    for task, (pid, name) in enumerate(tasks):
        yield pid, name, _task(job, task, version, nodename, _gpus(job, minors))


def _task(job: Mapping[str, Any], task: int, version: int, nodename: Any, gpus: List[int]) -> Dict[str, Any]:
    step, uid = str(job.get("step", "0")), int(job.get("uid", 1000))
    environ = dict(_LOGIN_ENV, SLURM_JOB_ID=str(job["id"]), SLURM_PROCID=str(task), SLURM_LOCALID=str(task))
    environ.update({name: str(job[key]) for name, key in _EXPORTED.items() if key in job})
    if gpus:
        environ["SLURM_JOB_GPUS"] = ",".join(map(str, gpus))
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(len(gpus))))
    return {
        "cgroup": slurm_cgroup_text(job["id"], step, uid, task, version, nodename),
        "uid": uid,
        "environ": environ,
    }


def _gpus(job: Mapping[str, Any], minors: Optional[Sequence[int]]) -> List[int]:
    return [minors[index] if minors else index for index in job.get("gpus", [])]


def _cgroups_of(cgroup_root: Path, text: str) -> Iterator[Path]:
    """The directories of the Slurm job cgroups a `/proc/<pid>/cgroup` text names: `<controller>/<path>` on
    cgroup v1 (a hierarchy is mounted at a directory named after its controllers), `<path>` on v2."""
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "/job_" in path:
            yield cgroup_root / controllers / path.lstrip("/")


def _job_directories(cgroup_root: Path, raw: Mapping[str, Any], job: Mapping[str, Any]) -> Iterator[Path]:
    """The job's own cgroup in each hierarchy that holds it, whether or not any task runs in it."""
    text = slurm_cgroup_text(job["id"], str(job.get("step", "0")), int(job.get("uid", 1000)), 0,
                             raw.get("cgroup_version", 2), raw.get("nodename"))
    for directory in _cgroups_of(cgroup_root, text):
        while not directory.name.startswith("job_"):
            directory = directory.parent
        yield directory


def _write_devices_list(
    cgroup_root: Path, raw: Mapping[str, Any], job: Mapping[str, Any], minors: Optional[Sequence[int]]
) -> None:
    hierarchies = {d.relative_to(cgroup_root).parts[0]: d for d in _job_directories(cgroup_root, raw, job)}
    lines = list(_BASE_DEVICES) + [f"c 195:{minor} rwm" for minor in _gpus(job, minors)]
    (hierarchies["devices"] / "devices.list").write_text("".join(f"{line}\n" for line in lines))
