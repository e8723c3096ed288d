"""Where a workload's cgroup is, in the host's tree.

`/proc/<pid>/cgroup` names a process's cgroup in each hierarchy
(kernel Documentation/admin-guide/cgroup-v2.rst, "Processes"): on cgroup v2 the `0::<path>` line, on v1
the line of the hierarchy that holds the cpu and cpuacct controllers (`cpu,cpuacct`, or `cpu` and
`cpuacct` mounted apart). The workload's cgroup is that path cut after the container's directory or
the Slurm job's (procfs.workload_path): a runtime or slurmstepd may put the processes in cgroups below
it (crun's `container`, a step's `step_0/user/task_0`), and the workload is the whole of them.

Which version. The host's tree is `<sysfs_root>/fs/cgroup`. Mounted there, cgroup v2 has
`cgroup.controllers` at its root (cgroup-v2.rst, "Enabling and Disabling"); a v1 or hybrid host mounts a
tmpfs there with a directory for each v1 hierarchy, and its cpu controller is on v1.

Paths seen from a cgroup namespace. A reader in a cgroup namespace of its own (a container's default on
cgroup v2) sees the path of a cgroup outside its namespace's root relative to that root, led by `..`
components: `0::/../../kubepods-besteffort.slice/...` (cgroup-v2.rst, "The Root and Views"). How far up
the `..` lead from the host's root is not said, so the rest is looked for in the host's tree: where it
starts with a systemd slice, at the slice's own place, which its name gives (`a-b-c.slice` is
`/a.slice/a-b.slice/a-b-c.slice`, systemd.slice(5)); then at the root, then under each directory down
to as many levels as there were `..`. Resolved once per text.
"""

import logging
import os
from functools import cached_property
from typing import Dict, List, Optional, Tuple

from gpu_monitoring.node.procfs import workload_path

log = logging.getLogger(__name__)

CGROUP_MOUNT = ("fs", "cgroup")  # under the sysfs root, as systemd and the kernel mount it
# Where a v1 host may have its cpu and cpuacct controllers: co-mounted (systemd's `cpu,cpuacct`, with
# `cpu` and `cpuacct` links to it), or each on a hierarchy of its own.
CPU_HIERARCHIES = ("cpu", "cpu,cpuacct", "cpuacct,cpu")
CPUACCT_HIERARCHIES = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")
_MAX_TEXTS = 4096  # resolved `cgroup` texts kept; past this the cache starts over
_MAX_SEARCHED = 4096  # directories looked in a level, at most, to place one namespace-relative path


def cgroup_version(tree: str) -> int:
    """2 where the tree at `tree` is cgroup v2 (its root has `cgroup.controllers`), else 1."""
    return 2 if os.path.exists(os.path.join(tree, "cgroup.controllers")) else 1


def hierarchy(tree: str, names: Tuple[str, ...]) -> str:
    """The first of a v1 tree's hierarchy directories `names` that exists (the first if none does)."""
    return next((os.path.join(tree, name) for name in names if os.path.isdir(os.path.join(tree, name))),
                os.path.join(tree, names[0]))


class CgroupPaths:
    """The host's path of a process's workload cgroup, from its `/proc/<pid>/cgroup` text."""

    def __init__(self, sysfs_root: str) -> None:
        self.tree = os.path.join(sysfs_root, *CGROUP_MOUNT)
        self._found: Dict[str, Optional[str]] = {}

    @cached_property
    def _layout(self) -> Tuple[int, str]:
        """The host's cgroup version and the directory its paths are under (v1: the cpu hierarchy's)."""
        version = cgroup_version(self.tree)
        return version, self.tree if version == 2 else hierarchy(self.tree, CPU_HIERARCHIES)

    def workload(self, text: str) -> Optional[str]:
        """The path (`/kubepods.slice/.../cri-containerd-<id>.scope`, `/slurm/uid_1001/job_48213`), or
        None for a process of no workload or a path found nowhere in the host's tree."""
        if text not in self._found:
            if len(self._found) >= _MAX_TEXTS:
                self._found.clear()
            self._found[text] = self._locate(text)
        return self._found[text]

    def _locate(self, text: str) -> Optional[str]:
        version, directory = self._layout
        path = workload_path(cgroup_line(text, version) or "")
        if path is None or not path.startswith("/../"):
            return path
        found = resolve(directory, path)
        if found is None:
            log.debug("the cgroup %s (seen from another cgroup namespace) is nowhere under %s", path, directory)
        return found


def cgroup_line(text: str, version: int) -> Optional[str]:
    """The path `/proc/<pid>/cgroup` gives in the hierarchy whose cgroups are read: v2's `0::` line, or
    the v1 line of the hierarchy with the cpu or cpuacct controller."""
    for line in text.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if version == 2 and number == "0" and not controllers:
            return path
        if version == 1 and {"cpu", "cpuacct"} & set(controllers.split(",")):
            return path
    return None


def resolve(directory: str, path: str) -> Optional[str]:
    """The host's path, under `directory`, of a `path` led by `..` (seen from another cgroup namespace);
    None where it is nowhere within reach."""
    segments = path.split("/")[1:]
    ups = 0
    while ups < len(segments) and segments[ups] == "..":
        ups += 1
    rest = segments[ups:]
    if not ups or not rest or ".." in rest:
        return None
    ancestors = systemd_slice_path(rest[0])
    tails = ["/".join(ancestors + rest[1:])] if ancestors else []
    tails.append("/".join(rest))
    return _search(directory, tails, ups)


def systemd_slice_path(name: str) -> Optional[List[str]]:
    """The slices from the root down to slice `name`, which its name spells (systemd.slice(5)): `a-b.slice`
    is `a.slice/a-b.slice`; the root slice `-.slice` is the root. None for a name that is no slice's."""
    if not name.endswith(".slice"):
        return None
    if name == "-.slice":
        return []
    parts = name[: -len(".slice")].split("-")
    return ["-".join(parts[: depth + 1]) + ".slice" for depth in range(len(parts))]


def _search(directory: str, tails: List[str], depth: int) -> Optional[str]:
    """The first `<base>/<tail>` that is a directory, its base at the root, then one level down, down to
    `depth` levels; at most _MAX_SEARCHED directories a level are looked in."""
    level = [""]
    for levels_down in range(depth + 1):
        for base in level:
            for tail in tails:
                if os.path.isdir(f"{directory}{base}/{tail}"):
                    return f"{base}/{tail}"
        if levels_down < depth:
            level = [f"{base}/{name}" for base in level for name in _subdirectories(directory + base)]
            level = level[:_MAX_SEARCHED]
    return None


def _subdirectories(directory: str) -> List[str]:
    try:
        with os.scandir(directory) as entries:
            return [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []
