"""Simulated NVML: GPU Performance Monitoring (Hopper and later).

A GPM sample remembers which engine set it read and when; a metrics query averages the
engine's load curve between its two samples, as real GPM derives rates from two counter
snapshots.
"""

import ctypes

import pynvml

from gpu_monitoring.simulator.abi import nvml, put_pointer
from gpu_monitoring.simulator.device_model import MIB

OK = pynvml.NVML_SUCCESS

PCIE_MIB_PER_S = {
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx_bytes",
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx_bytes",
}
# The profiling metric (SimDevice.profile's key) each GPM metric reports.
GPM_PROFILE = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: "graphics",
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "occupancy",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram",
    pynvml.NVML_GPM_METRIC_FP64_UTIL: "fp64",
    pynvml.NVML_GPM_METRIC_FP32_UTIL: "fp32",
    pynvml.NVML_GPM_METRIC_FP16_UTIL: "fp16",
}


@nvml("hp")
def nvmlGpmQueryDeviceSupport(sim, target, out):
    support = pynvml.c_nvmlGpmSupport_t.from_address(out)
    if support.version != pynvml.NVML_GPM_SUPPORT_VERSION:
        return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    support.isSupportedDevice = int(bool(target.device.spec.get("gpm")))
    return OK


@nvml("p")
def nvmlGpmSampleAlloc(sim, out):
    sample_id = sim.new_id()
    sim.gpm_samples[sample_id] = None
    put_pointer(out, sample_id)
    return OK


@nvml("p")
def nvmlGpmSampleFree(sim, sample_id):
    if sample_id not in sim.gpm_samples:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    del sim.gpm_samples[sample_id]
    return OK


@nvml("hp")
def nvmlGpmSampleGet(sim, target, sample_id):
    return _record(sim, target.device, target.device.load, sample_id)


@nvml("hup")
def nvmlGpmMigSampleGet(sim, target, gpu_instance_id, sample_id):
    for instance in target.device.mig:
        if instance.spec.gpu_instance_id == gpu_instance_id:
            return _record(sim, target.device, instance.load, sample_id)
    return pynvml.NVML_ERROR_INVALID_ARGUMENT


def _record(sim, device, load, sample_id):
    if not device.spec.get("gpm"):
        return pynvml.NVML_ERROR_NOT_SUPPORTED
    if sample_id not in sim.gpm_samples:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    sim.gpm_samples[sample_id] = (device, load, sim.now())
    return OK


def _pcie_rate(device, load, metric, t1, t2) -> None:
    """The device's PCIe traffic between the samples, from the same counters the fields give;
    a GPU instance's sample has none of its own."""
    if load is not device.load or t2 <= t1:
        metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return
    key = PCIE_MIB_PER_S[metric.metricId]
    metric.value = (device.counters(t2)[key] - device.counters(t1)[key]) / (t2 - t1) / MIB
    metric.nvmlReturn = OK


@nvml("p")
def nvmlGpmMetricsGet(sim, out):
    query = pynvml.c_nvmlGpmMetricsGet_t.from_address(out)
    if query.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
        return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    first = sim.gpm_samples.get(ctypes.cast(query.sample1, ctypes.c_void_p).value)
    second = sim.gpm_samples.get(ctypes.cast(query.sample2, ctypes.c_void_p).value)
    if not first or not second or first[1] is not second[1]:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    device, load, t1 = first
    t2 = second[2]
    profile = device.profile(load, t1, t2)
    for i in range(query.numMetrics):
        metric = query.metrics[i]
        if metric.metricId in PCIE_MIB_PER_S:
            _pcie_rate(device, load, metric, t1, t2)
            continue
        key = GPM_PROFILE.get(metric.metricId)
        if key is None:
            metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            continue
        metric.value = profile[key]
        metric.nvmlReturn = OK
    return OK
