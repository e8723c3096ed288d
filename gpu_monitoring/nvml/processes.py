"""Process lists and per-process engine samples, each one NVML call (a `Filling`, see nvml.array_room).

These stand in for pynvml's bindings, which ask twice a time (count, then fill). The room learnt
on one run serves the next, and the entries are read out of the room's array into plain data
before the call returns: the next call refills it.
"""

import ctypes
from typing import Any, Dict, List, Optional, Tuple

import pynvml

from gpu_monitoring.nvml.library import Filling, plain

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
STRUCTS = (("_v3", plain(pynvml.c_nvmlProcessInfo_v3_t)), ("_v2", plain(pynvml.c_nvmlProcessInfo_v2_t)),
           ("", ProcessInfoV1))
UtilizationSample = plain(pynvml.c_nvmlProcessUtilizationSample_t)


# A listed process: pid, used memory (bytes, None where NVML cannot tell) and its GPU and compute
# instance IDs (None outside MIG).
Listed = Tuple[int, Optional[int], Optional[int], Optional[int]]
# A process's mean engine use over its samples, in percent: sm, memory, encoder, decoder.
Usage = Tuple[float, float, float, float]
# Windows' WDDM mode cannot tell a process's memory: NVML says so with all bits set.
_MEMORY_UNKNOWN = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


def _count_then_array(count: Any, array: Any) -> Tuple[Any, Any]:
    return count, array


def _listed(entries: List[Any]) -> List[Listed]:
    return [_listed_process(entry) for entry in entries]


def _samples_since(since_us: int, count: Any, array: Any) -> Tuple[Any, ...]:
    # The timestamp goes as a C unsigned long long: ctypes would pass a bare int as a C int.
    return array, count, ctypes.c_ulonglong(since_us)


# Each query's versions, newest first.
VERSIONS: Dict[str, Tuple[Filling, ...]] = {
    query: tuple(Filling(query + suffix, struct, _count_then_array, _listed, room=query) for suffix, struct in STRUCTS)
    for query in (COMPUTE, MPS)
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


# Usage by pid since the time asked about, and the newest sample's time. No new samples (NOT_FOUND)
# means no process ran on the GPU since then: an empty answer.
SAMPLES = Filling(UTILIZATION, UtilizationSample, _samples_since, usage_by_pid, not_found_is_empty=True)
