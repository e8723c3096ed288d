"""A fake proc root: `<pid>/{comm,cgroup,stat,status,environ}` as a GPU node's kernel would show them,
`driver/nvidia/gpus/<bus id>/information` as the NVIDIA kernel module writes it for each GPU,
`sys/kernel/random/boot_id`, and `stat` with the boot's time (`btime`).

Each container's cgroup path is rendered the way its runtime lays it out under the kubelet,
for either cgroup driver and either cgroup version, and each Slurm job step's the way slurmstepd
lays it out, so the attribution code reads the same text it meets on real nodes.
"""

import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Iterable, Mapping, Optional

from gpu_monitoring.simulator.scenario import DeviceSpec

# The keys of a process mapping that shape its cgroup file; others (memory, SM%) are not ours.
_CGROUP_KEYS = ("container_id", "pod_uid", "qos", "runtime", "cgroup_driver", "cgroup_version", "unit")
_QOS_CLASSES = ("burstable", "besteffort", "guaranteed")
# How each runtime names a container's cgroup under the systemd driver and under cgroupfs.
_LEAF = {
    "containerd": ("cri-containerd-{}.scope", "{}"),
    "crio": ("crio-{}.scope", "crio-{}"),
    "docker": ("docker-{}.scope", "{}"),
}
_DRIVERS = ("systemd", "cgroupfs")
# cgroup v1 hierarchies numbered as a typical kernel does; runtimes leave rdma at the root.
_V1_HIERARCHIES = (
    "name=systemd", "cpu,cpuacct", "blkio", "memory", "devices", "freezer", "cpuset", "perf_event",
    "net_cls,net_prio", "hugetlb", "pids", "rdma",
)
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
_POD_UID = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}|[0-9a-f]{32}")
_USER_SESSION = "/user.slice/user-1000.slice/session-3.scope"
# Slurm's cgroup v1 plugins: proctrack/cgroup tracks the step in freezer, task/cgroup constrains
# each task in these; slurmd's own unit stays in systemd's hierarchy.
_SLURM_TASK_HIERARCHIES = ("cpu,cpuacct", "memory", "devices", "cpuset")
# A process's state letter and the name `status` gives it (fs/proc/array.c, task_state_array; proc(5)).
STATES = {"R": "running", "S": "sleeping", "D": "disk sleep", "T": "stopped", "t": "tracing stop",
          "X": "dead", "Z": "zombie", "P": "parked", "I": "idle"}
_DEFAULT_START = 4_200_000  # clock ticks after boot: a process started some eleven hours in
_PATH = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"}


def build_proc_root(
    directory: Path, processes: Iterable[Mapping], devices: Iterable[DeviceSpec] = (), boot_id: Optional[str] = None,
    boot_time: Optional[int] = None,
) -> Path:
    """Write `<directory>/<pid>/{comm,cgroup,stat,status,environ}` for each process, the driver's record of
    each device, the kernel's boot ID and `stat` (booted at `boot_time`, seconds since the epoch) when given,
    and return `directory`.

    A process mapping has `pid`, `name`, and either `cgroup` (the file's text, as is) or the
    keyword arguments of `cgroup_text`; optionally `uid` (0), `start_time` (clock ticks after
    boot), `state` (its state letter, S by default: D for one stuck in uninterruptible sleep, Z for
    a zombie) and `environ` (a mapping; a PATH by default).
    """
    if boot_id is not None:
        random_dir = directory / "sys" / "kernel" / "random"
        random_dir.mkdir(parents=True, exist_ok=True)
        (random_dir / "boot_id").write_text(f"{boot_id}\n")
    if boot_time is not None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "stat").write_text(kernel_stat(boot_time))
    for device in devices:
        gpu_dir = directory / "driver" / "nvidia" / "gpus" / device.pci_address
        gpu_dir.mkdir(parents=True, exist_ok=True)
        (gpu_dir / "information").write_text(driver_information(device))
    for process in processes:
        pid_dir = directory / str(process["pid"])
        pid_dir.mkdir(parents=True, exist_ok=True)
        (pid_dir / "comm").write_text(f"{process['name']}\n")
        options = {key: process[key] for key in _CGROUP_KEYS if key in process}
        (pid_dir / "cgroup").write_text(process["cgroup"] if "cgroup" in process else cgroup_text(**options))
        state = process.get("state", "S")
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, not {state!r}")
        start_time = process.get("start_time", _DEFAULT_START)
        (pid_dir / "stat").write_text(_stat(process["pid"], process["name"], start_time, state))
        (pid_dir / "status").write_text(_status(process["pid"], process["name"], process.get("uid", 0), state))
        environ = process.get("environ", _PATH)
        (pid_dir / "environ").write_text("".join(f"{key}={value}\0" for key, value in environ.items()))
    return directory


def boot_id_of(scenario: str) -> str:
    """The boot ID of a scenario's node: the kernel makes a random UUID at each boot
    (`/proc/sys/kernel/random/boot_id`, Documentation/admin-guide/sysctl/kernel.rst); a simulated node
    boots once, so it is one the scenario's name fixes."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"boot/{scenario}"))


def kernel_stat(boot_time: int) -> str:
    """`/proc/stat` of a 4-CPU node booted at `boot_time`, in the lines and order fs/proc/stat.c's show_stat
    writes (Documentation/filesystems/proc.rst, "1.7 Miscellaneous kernel statistics in /proc/stat"): CPU
    time in USER_HZ ticks (user nice system idle iowait irq softirq steal guest guest_nice), the interrupt
    total, context switches, `btime` (the boot's time, seconds since the epoch), processes forked, those
    runnable and blocked. Only `btime` is read here; the rest is a quiet node's."""
    cpus = [(4721, 12, 1893, 54210, 311, 0, 97, 0, 0, 0)] * 4
    total = [sum(column) for column in zip(*cpus)]
    lines = ["cpu  " + " ".join(map(str, total))]
    lines += [f"cpu{n} " + " ".join(map(str, times)) for n, times in enumerate(cpus)]
    lines += ["intr 0", "ctxt 2846113", f"btime {boot_time}", "processes 9172", "procs_running 2", "procs_blocked 0",
              "softirq 0 0 0 0 0 0 0 0 0 0 0"]
    return "\n".join(lines) + "\n"


def replace_process(directory: Path, process: Mapping) -> None:
    """Put `process` at its pid's directory in place of the one there, as the kernel does when it
    gives a pid to a new process (or looks an evicted one up again): another directory, not the
    old one's files rewritten. It is built beside the old one first, so it gets another inode."""
    staging = directory / ".replacing"
    build_proc_root(staging, [process])
    shutil.rmtree(directory / str(process["pid"]))
    os.rename(staging / str(process["pid"]), directory / str(process["pid"]))
    staging.rmdir()


def slurm_cgroup_text(
    job_id: int, step: str = "0", uid: int = 1000, task: int = 0, cgroup_version: int = 2,
    nodename: Optional[str] = None,
) -> str:
    """The `/proc/<pid>/cgroup` text of task `task` of a Slurm job step, as slurmstepd places it.

    `nodename` is set when the host runs several slurmd (built with --enable-multiple-slurmd).
    """
    job_path = slurm_job_cgroup_path(job_id, uid, cgroup_version, nodename)
    if cgroup_version == 2:
        return f"0::{job_path}/step_{step}/user/task_{task}\n"
    step_path = f"{job_path}/step_{step}"
    paths = {"freezer": step_path, "name=systemd": "/system.slice/slurmd.service"}
    paths.update(dict.fromkeys(_SLURM_TASK_HIERARCHIES, f"{step_path}/task_{task}"))
    numbered = reversed(list(enumerate(_V1_HIERARCHIES, 1)))
    return "".join(f"{number}:{name}:{paths.get(name, '/')}\n" for number, name in numbered)


def slurm_job_cgroup_path(job_id: int, uid: int = 1000, cgroup_version: int = 2, nodename: Optional[str] = None) -> str:
    """The host's path of a Slurm job's own cgroup, its steps' parent: in slurmstepd's scope on cgroup v2,
    under `slurm[_<nodename>]/uid_<uid>` in each v1 hierarchy."""
    if cgroup_version == 2:
        scope = f"{nodename}_slurmstepd.scope" if nodename else "slurmstepd.scope"
        return f"/system.slice/{scope}/job_{job_id}"
    if cgroup_version != 1:
        raise ValueError(f"cgroup_version must be 1 or 2, not {cgroup_version!r}")
    return f"/{'slurm_' + nodename if nodename else 'slurm'}/uid_{uid}/job_{job_id}"


def driver_information(device: DeviceSpec) -> str:
    """The text of a GPU's `information` file, line by line as nv-procfs.c (open-gpu-kernel-modules,
    nv_procfs_read_gpu_info) prints it. The driver writes it from what it learnt when it probed the
    GPU, its UUID included, so it reads the same once the GPU has fallen off the bus."""
    return (
        f"Model: \t\t {device['name']}\n"
        f"IRQ:   \t\t {0x9A + device.index}\n"
        f"GPU UUID: \t {device.uuid}\n"
        "Video BIOS: \t 96.00.99.00.01\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 52 bits\n"
        "DMA Mask: \t 0xfffffffffffff\n"
        f"Bus Location: \t {device.pci_address}\n"
        f"Device Minor: \t {device.get('minor_number', device.index)}\n"
        "GPU Excluded:\t No\n"
    )


def _stat(pid: int, name: str, start_time: int, state: str = "S") -> str:
    # Fields 3-21 (state, parent, group, session, terminal, flags, faults, times, priority, threads),
    # 22 the start time, 23-52 the rest: the state and the start time matter here.
    before = [state, "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12
    return f"{pid} ({name}) " + " ".join(before + [str(start_time)] + ["0"] * 30) + "\n"


def _status(pid: int, name: str, uid: int, state: str = "S") -> str:
    ids = "\t".join([str(uid)] * 4)  # real, effective, saved, filesystem
    return (f"Name:\t{name}\nState:\t{state} ({STATES[state]})\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t1\n"
            f"Uid:\t{ids}\nGid:\t{ids}\n")


def cgroup_text(
    container_id: Optional[str] = None,
    pod_uid: Optional[str] = None,
    qos: str = "burstable",
    runtime: str = "containerd",
    cgroup_driver: str = "systemd",
    cgroup_version: int = 2,
    unit: Optional[str] = None,
) -> str:
    """The `/proc/<pid>/cgroup` text of a process in that container of that pod.

    Without `container_id` the process is the host's: in systemd `unit` (e.g.
    `nvidia-persistenced.service`) or else in a login session. A docker container without
    `pod_uid` is one docker runs by itself, outside Kubernetes.
    """
    path = _cgroup_path(container_id, pod_uid, qos, runtime, cgroup_driver, unit)
    if cgroup_version == 2:
        return f"0::{path}\n"
    if cgroup_version == 1:
        numbered = reversed(list(enumerate(_V1_HIERARCHIES, 1)))
        return "".join(f"{number}:{name}:{'/' if name == 'rdma' else path}\n" for number, name in numbered)
    raise ValueError(f"cgroup_version must be 1 or 2, not {cgroup_version!r}")


def container_cgroup_path(
    container_id: str, pod_uid: Optional[str] = None, qos: str = "burstable", runtime: str = "containerd",
    cgroup_driver: str = "systemd",
) -> str:
    """The host's path of a container's cgroup, the one `cgroup_text` names for its processes."""
    return _cgroup_path(container_id, pod_uid, qos, runtime, cgroup_driver, None)


def _cgroup_path(
    container_id: Optional[str], pod_uid: Optional[str], qos: str, runtime: str, driver: str, unit: Optional[str]
) -> str:
    if driver not in _DRIVERS:
        raise ValueError(f"cgroup_driver must be one of {', '.join(_DRIVERS)}, not {driver!r}")
    if container_id is None:
        if pod_uid is not None:
            raise ValueError("a process with a pod_uid needs the container_id of its container")
        return f"/system.slice/{unit}" if unit else _USER_SESSION
    if runtime not in _LEAF:
        raise ValueError(f"runtime must be one of {', '.join(_LEAF)}, not {runtime!r}")
    if not _CONTAINER_ID.fullmatch(container_id):
        raise ValueError(f"container_id must be 64 lowercase hex digits, as runtimes make them: {container_id!r}")
    leaf = _LEAF[runtime][_DRIVERS.index(driver)].format(container_id)
    if pod_uid is not None:
        return f"{_pod_path(pod_uid, qos, driver)}/{leaf}"
    if runtime == "docker":
        return f"/system.slice/{leaf}" if driver == "systemd" else f"/docker/{leaf}"
    raise ValueError(f"a {runtime} container needs the pod_uid of its pod; only docker runs containers alone")


def _pod_path(pod_uid: str, qos: str, driver: str) -> str:
    if not _POD_UID.fullmatch(pod_uid):
        raise ValueError(f"pod_uid must be a lowercase UUID, or 32 hex digits for a static pod: {pod_uid!r}")
    if qos not in _QOS_CLASSES:
        raise ValueError(f"qos must be one of {', '.join(_QOS_CLASSES)}, not {qos!r}")
    levels = ["kubepods"] if qos == "guaranteed" else ["kubepods", qos]
    if driver == "cgroupfs":
        return "/" + "/".join(levels + [f"pod{pod_uid}"])
    # systemd names each slice after all its ancestors, joined by "-", so the UID's own dashes become "_".
    names = ["-".join(levels[: depth + 1]) for depth in range(len(levels))]
    names.append(f"{names[-1]}-pod{pod_uid.replace('-', '_')}")
    return "".join(f"/{name}.slice" for name in names)
