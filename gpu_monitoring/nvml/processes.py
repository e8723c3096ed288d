"""Process lists and per-process engine samples, each one NVML call through `listing`.

Bindings here stand in for pynvml's, which ask twice a time (count, then fill). They take a
`listing.Room` the device keeps per query, so the room learnt on one run serves the next, and
read the entries out of the room's array before they return plain data: the next call refills it.
"""

import ctypes
from typing import Any, Callable, Dict, List, Optional, Tuple

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


# A listed process: pid, used memory (bytes, None where NVML cannot tell) and its GPU and compute
# instance IDs (None outside MIG).
Listed = Tuple[int, Optional[int], Optional[int], Optional[int]]
# A process's mean engine use over its samples, in percent: sm, memory, encoder, decoder.
Usage = Tuple[float, float, float, float]
# Windows' WDDM mode cannot tell a process's memory: NVML says so with all bits set.
_MEMORY_UNKNOWN = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


def _list_query(symbol: str, struct: type) -> Callable[[Any, listing.Room], List[Listed]]:
    def query(handle: Any, room: listing.Room) -> List[Listed]:
        return [_listed_process(entry) for entry in listing.fill(handle, symbol, struct, room, _count_then_array)]

    return query


def _count_then_array(count: Any, array: Any) -> Tuple[Any, Any]:
    return count, array


def _utilization_query(handle: Any, room: listing.Room, since_us: int) -> Tuple[Dict[int, Usage], int]:
    # The timestamp goes as a C unsigned long long: ctypes would pass a bare int as a C int.
    samples = listing.fill(handle, UTILIZATION, UtilizationSample, room,
                           lambda count, array: (array, count, ctypes.c_ulonglong(since_us)))
    return usage_by_pid(samples, since_us)


BINDINGS: Dict[str, Callable[..., Any]] = {
    **{f"{query}{suffix}": _list_query(f"{query}{suffix}", struct)
       for query in (COMPUTE, MPS) for suffix, struct in VERSIONS},
    UTILIZATION: _utilization_query,
}
# Each query's symbols in BINDINGS, newest first.
SYMBOLS: Dict[str, Tuple[str, ...]] = {
    **{query: tuple(query + suffix for suffix, _ in VERSIONS) for query in (COMPUTE, MPS)},
    UTILIZATION: (UTILIZATION,),
}


def _listed_process(entry: Any) -> Listed:
    memory = entry.usedGpuMemory
    gi = getattr(entry, "gpuInstanceId", _NO_INSTANCE)  # the v1 struct predates MIG
    ci = getattr(entry, "computeInstanceId", _NO_INSTANCE)
    return (entry.pid, None if memory == _MEMORY_UNKNOWN else memory,
            None if gi == _NO_INSTANCE else gi, None if ci == _NO_INSTANCE else ci)


def usage_by_pid(samples: List[Any], since_us: int) -> Tuple[Dict[int, Usage], int]:
    """Each pid's mean engine use over its samples, and the newest sample's time."""
    sums: Dict[int, List[int]] = {}  # sm, memory, encoder, decoder and how many samples, per pid
    newest = since_us
    for sample in samples:
        newest = max(newest, sample.timeStamp)
        total = sums.get(sample.pid)
        if total is None:
            sums[sample.pid] = [sample.smUtil, sample.memUtil, sample.encUtil, sample.decUtil, 1]
        else:
            total[0] += sample.smUtil
            total[1] += sample.memUtil
            total[2] += sample.encUtil
            total[3] += sample.decUtil
            total[4] += 1
    usage = {pid: (sm / n, memory / n, encoder / n, decoder / n)
             for pid, (sm, memory, encoder, decoder, n) in sums.items()}
    return usage, newest
