"""Process lists and per-process engine samples, each one NVML call through `listing`.

Bindings here stand in for pynvml's, which ask twice a time (count, then fill). They take a
`listing.Room` the device keeps per query, so the room learnt on one run serves the next.
"""

import ctypes
from typing import Any, Callable, Dict, List, Tuple

import pynvml

from . import listing
from .queries import plain

COMPUTE = "nvmlDeviceGetComputeRunningProcesses"
MPS = "nvmlDeviceGetMPSComputeRunningProcesses"
UTILIZATION = "nvmlDeviceGetProcessUtilization"
_NO_INSTANCE = 0xFFFFFFFF


class ProcessInfoV1(ctypes.Structure):
    """`nvmlProcessInfo_v1_t`, what drivers before the `_v2` queries (R450) fill in."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


# Newer symbols first. `_v2` added MIG instance IDs to the struct and `_v3` kept its layout; the
# unversioned symbol of an old driver fills the v1 struct (pynvml's unversioned binding would call `_v3`).
# pynvml's layouts without its per-attribute hooks: a GPU lists dozens of processes a run.
VERSIONS = (("_v3", plain(pynvml.c_nvmlProcessInfo_v3_t)), ("_v2", plain(pynvml.c_nvmlProcessInfo_v2_t)),
            ("", ProcessInfoV1))
UtilizationSample = plain(pynvml.c_nvmlProcessUtilizationSample_t)


def _list_query(symbol: str, struct: type) -> Callable[[Any, listing.Room], List[Any]]:
    def query(handle: Any, room: listing.Room) -> List[Any]:
        return listing.fill(handle, symbol, struct, room, lambda count, array: (count, array))

    return query


def _utilization_query(handle: Any, room: listing.Room, since: ctypes.c_ulonglong) -> List[Any]:
    return listing.fill(handle, UTILIZATION, UtilizationSample, room,
                        lambda count, array: (array, count, since))


BINDINGS: Dict[str, Callable[..., Any]] = {
    **{f"{query}{suffix}": _list_query(f"{query}{suffix}", struct)
       for query in (COMPUTE, MPS) for suffix, struct in VERSIONS},
    UTILIZATION: _utilization_query,
}


def process(entry: Any, kind: str) -> Dict[str, Any]:
    """pid, used_memory (bytes, None where NVML cannot tell), kind and MIG instance IDs of one entry."""
    memory = entry.usedGpuMemory
    # Windows' WDDM mode cannot tell a process's memory: NVML says so with all bits set.
    unknown = memory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    gi = getattr(entry, "gpuInstanceId", _NO_INSTANCE)
    ci = getattr(entry, "computeInstanceId", _NO_INSTANCE)
    return {
        "pid": entry.pid,
        "used_memory": None if unknown else memory,
        "kind": kind,
        "gpu_instance_id": None if gi == _NO_INSTANCE else gi,
        "compute_instance_id": None if ci == _NO_INSTANCE else ci,
    }


def usage_by_pid(samples: List[Any], since_us: int) -> Tuple[Dict[int, Dict[str, float]], int]:
    """Each pid's mean engine use over its samples, and the newest sample's time."""
    sums: Dict[int, List[int]] = {}
    newest = since_us
    for sample in samples:
        newest = max(newest, sample.timeStamp)
        total = sums.setdefault(sample.pid, [0, 0, 0, 0, 0])
        for slot, value in enumerate((sample.smUtil, sample.memUtil, sample.encUtil, sample.decUtil, 1)):
            total[slot] += value
    usage = {
        pid: {key: total[slot] / total[4] for slot, key in enumerate(("sm", "memory", "encoder", "decoder"))}
        for pid, total in sums.items()
    }
    return usage, newest
