"""Simulated NVML: the process queries (compute and MPS-client lists, every version, and
per-process utilization samples), which fill a caller's array as libnvidia-ml does: the count
asked for in, the count there is out, INSUFFICIENT_SIZE when the array is too small."""

import ctypes

import pynvml

from gpu_monitoring.nvml.processes import ProcessInfoV1
from gpu_monitoring.simulator.abi import array_at, nvml, put_uint
from gpu_monitoring.simulator.device_model import MIB, is_mps_server

OK = pynvml.NVML_SUCCESS
SAMPLE_BUFFER = 72  # process samples a real driver (580, H100) makes room for


def _processes(sim, target, count_ptr, array_ptr, kind, struct):
    now = sim.now()
    pool = target.mig.processes(now) if target.mig else target.device.processes(now)
    # A real driver lists an MPS client among the compute processes too (nvidia-smi's "M+C").
    procs = [p for p in pool if kind == "compute" or p.get("type", "compute") == kind]
    capacity = ctypes.c_uint.from_address(count_ptr).value
    put_uint(count_ptr, len(procs))
    if not procs:
        return OK
    if array_ptr is None or capacity < len(procs):
        return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    for entry, proc in zip(array_at(struct, len(procs)).from_address(array_ptr), procs):
        entry.pid = proc["pid"]
        entry.usedGpuMemory = int(proc.get("memory_mib", 0) * MIB)
        if hasattr(entry, "gpuInstanceId"):  # the v1 struct predates MIG
            entry.gpuInstanceId = proc.get("gpu_instance_id", 0xFFFFFFFF)
            entry.computeInstanceId = proc.get("compute_instance_id", 0xFFFFFFFF)
    return OK


def _sampled(device, now):
    """The processes samples name, with their shares: as on a real driver, the kernels of MPS
    clients run in the MPS server, which is sampled for all of them and they for none."""
    shares = [(p, share) for p, share in device.process_shares(now) if share > 0]
    server = next((p for p in device.processes(now) if is_mps_server(p)), None)
    clients = sum(share for p, share in shares if p.get("type") == "mps")
    if server is None or not clients:
        return shares
    return [(p, share) for p, share in shares if p.get("type") != "mps"] + [(server, clients)]


def _process_query(name: str, kind: str, struct) -> None:
    def query(sim, target, count_ptr, array_ptr):
        return _processes(sim, target, count_ptr, array_ptr, kind, struct)

    query.__name__ = name
    nvml("hpp")(query)


# Every version of the queries: the struct grew MIG instance IDs in _v2; _v3 kept _v2's layout.
for _query, _kind in (("nvmlDeviceGetComputeRunningProcesses", "compute"),
                      ("nvmlDeviceGetMPSComputeRunningProcesses", "mps")):
    for _suffix, _struct in (("_v3", pynvml.c_nvmlProcessInfo_v2_t), ("_v2", pynvml.c_nvmlProcessInfo_v2_t),
                             ("", ProcessInfoV1)):
        _process_query(_query + _suffix, _kind, _struct)


@nvml("hppU")
def nvmlDeviceGetProcessUtilization(sim, target, samples_ptr, count_ptr, since_us):
    now_us = int(sim.now() * 1e6)
    busy = _sampled(target.device, sim.now())
    # As a real H100 on driver 580 does: room for the whole sample buffer first, however few
    # samples follow, and only then whether there are any.
    needed = max(SAMPLE_BUFFER, len(busy))
    if samples_ptr is None or ctypes.c_uint.from_address(count_ptr).value < needed:
        put_uint(count_ptr, needed)
        return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    if not busy or now_us <= since_us:
        return pynvml.NVML_ERROR_NOT_FOUND
    put_uint(count_ptr, len(busy))
    util = target.device.utilization(sim.now())
    memory_share = target.device.spec.load.get("memory_bandwidth_share", 0.55)
    samples = array_at(pynvml.c_nvmlProcessUtilizationSample_t, len(busy)).from_address(samples_ptr)
    for sample, (proc, share) in zip(samples, busy):
        sample.pid = proc["pid"]
        sample.timeStamp = now_us
        sample.smUtil = int(round(util * share))
        sample.memUtil = int(round(util * share * memory_share))
        sample.encUtil = int(target.device.spec.load.get("encoder", 0) * share * util / 100)
        sample.decUtil = int(target.device.spec.load.get("decoder", 0) * share * util / 100)
    return OK
