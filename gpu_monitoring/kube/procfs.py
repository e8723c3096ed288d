"""Which container and pod a process belongs to, read from a proc root.

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
"""

import os
import re
from dataclasses import dataclass
from typing import Iterator, Optional


@dataclass(frozen=True)
class ProcessOwner:
    """The container and pod a process runs in; both None for a process of the host itself."""

    container_id: Optional[str]
    pod_uid: Optional[str]


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


def parse_cgroup(text: str) -> ProcessOwner:
    """The owner named by the contents of `/proc/<pid>/cgroup`, cgroup v1 or v2.

    cgroup v1 lists one line per hierarchy, and some (rdma, the hybrid `0::` line) may stay at
    `/` for a container process, so the first line naming a container wins, then one naming a pod.
    """
    owners = [_owner_of_path(path) for path in _paths(text)]
    with_container = [owner for owner in owners if owner.container_id]
    with_pod = [owner for owner in owners if owner.pod_uid]
    return (with_container or with_pod or [_HOST])[0]


def process_owner(proc_root: str, pid: int) -> Optional[ProcessOwner]:
    """The owner of process `pid`, or None when it exited since it was listed.

    Two failures are raised rather than read as an exit, for the caller to report once: a
    PermissionError (`cgroup` is world-readable, so it means a proc mount with `hidepid` or a
    security policy) and a FileNotFoundError for a proc root that does not exist (not mounted).
    """
    text = _read(proc_root, pid, "cgroup")
    return None if text is None else parse_cgroup(text)


def process_name(proc_root: str, pid: int) -> Optional[str]:
    """The command name of process `pid` (its `comm`), or None when it exited; raises as `process_owner` does."""
    text = _read(proc_root, pid, "comm")
    return None if text is None else text.rstrip("\n")


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
