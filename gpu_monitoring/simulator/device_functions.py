"""Simulated NVML: per-device queries.

Each function receives the `Target` its handle names; the library has already refused
calls on lost GPUs, on MIG handles that NVML does not serve, and on functions the
scenario marks unsupported for the device.
"""

import ctypes

import pynvml

from gpu_monitoring.simulator.abi import array_at, nvml, put_pointer, put_string, put_uint, put_ulonglong, struct_at
from gpu_monitoring.simulator.device_model import MIB

OK = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
CLOCK_KINDS = {
    pynvml.NVML_CLOCK_GRAPHICS: "graphics",
    pynvml.NVML_CLOCK_SM: "sm",
    pynvml.NVML_CLOCK_MEM: "memory",
    pynvml.NVML_CLOCK_VIDEO: "video",
}
ARCHITECTURES = {
    "kepler": pynvml.NVML_DEVICE_ARCH_KEPLER,
    "maxwell": pynvml.NVML_DEVICE_ARCH_MAXWELL,
    "pascal": pynvml.NVML_DEVICE_ARCH_PASCAL,
    "volta": pynvml.NVML_DEVICE_ARCH_VOLTA,
    "turing": pynvml.NVML_DEVICE_ARCH_TURING,
    "ampere": pynvml.NVML_DEVICE_ARCH_AMPERE,
    "ada": pynvml.NVML_DEVICE_ARCH_ADA,
    "hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
    "blackwell": pynvml.NVML_DEVICE_ARCH_BLACKWELL,
}
# The VBIOS of a device whose model names no `vbios`: what `nvidia-smi -q` shows on one board of each
# architecture (GeForce GTX TITAN Z, GTX TITAN X, GTX 1070, Tesla V100-SXM2-16GB, Tesla T4,
# A100-SXM4-80GB, L4, H100 80GB HBM3, B200). Hexadecimal fields are upper case, as the driver writes them.
VBIOS = {
    "kepler": "80.80.60.00.90",
    "maxwell": "84.00.45.00.03",
    "pascal": "86.04.26.00.36",
    "volta": "88.00.4F.00.09",
    "turing": "90.04.38.00.03",
    "ampere": "92.00.45.00.05",
    "ada": "95.04.29.00.06",
    "hopper": "96.00.74.00.0D",
    "blackwell": "97.00.C5.00.2F",
}


def _string(buffer, size, text):
    return OK if put_string(buffer, size, text) else pynvml.NVML_ERROR_INSUFFICIENT_SIZE


# --- identity ----------------------------------------------------------------------


@nvml("hpu")
def nvmlDeviceGetUUID(sim, target, buffer, size):
    return _string(buffer, size, target.mig.spec.uuid if target.mig else target.device.spec.uuid)


@nvml("hpu")
def nvmlDeviceGetName(sim, target, buffer, size):
    name = target.device.spec["name"]
    if target.mig:
        name = f"{name} MIG {target.mig.spec.profile}"
    return _string(buffer, size, name)


@nvml("hp")
def nvmlDeviceGetPciInfo_v3(sim, target, out):
    info = struct_at(pynvml.nvmlPciInfo_t, out)
    bus_id = target.device.spec.pci_bus_id
    domain, bus, rest = bus_id.split(":")
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    info.pciDeviceId = target.device.spec.pci_device_id
    info.busId = bus_id.encode()
    info.busIdLegacy = bus_id[4:].encode()
    return OK


@nvml("hp")
def nvmlDeviceGetArchitecture(sim, target, out):
    put_uint(out, ARCHITECTURES[target.device.spec["architecture"]])
    return OK


@nvml("hp")
def nvmlDeviceGetMinorNumber(sim, target, out):
    put_uint(out, target.device.spec.get("minor_number", target.device.index))
    return OK


@nvml("hpu")
def nvmlDeviceGetVbiosVersion(sim, target, buffer, size):
    spec = target.device.spec
    return _string(buffer, size, spec.get("vbios", VBIOS[spec["architecture"]]))


@nvml("hp")
def nvmlDeviceGetPersistenceMode(sim, target, out):
    """On unless the device says `persistence_mode: false`: servers run nvidia-persistenced (DGX OS,
    the GPU Operator's driver container). A test turns it off or on by setting that fact, as
    `nvidia-smi -pm` does while the driver runs."""
    enabled = target.device.spec.get("persistence_mode", True)
    put_uint(out, pynvml.NVML_FEATURE_ENABLED if enabled else pynvml.NVML_FEATURE_DISABLED)
    return OK


# --- utilization -------------------------------------------------------------------


@nvml("hp")
def nvmlDeviceGetUtilizationRates(sim, target, out):
    util = target.device.utilization(sim.now())
    rates = struct_at(pynvml.c_nvmlUtilization_t, out)
    rates.gpu = int(round(util))
    rates.memory = int(round(util * target.device.spec.load.get("memory_bandwidth_share", 0.55)))
    return OK


def _codec(sim, target, out, period, key):
    share = target.device.spec.load.get(key)
    if share is None:
        return NOT_SUPPORTED
    put_uint(out, int(share * target.device.utilization(sim.now()) / 100))
    put_uint(period, 167000)
    return OK


@nvml("hpp")
def nvmlDeviceGetEncoderUtilization(sim, target, out, period):
    return _codec(sim, target, out, period, "encoder")


@nvml("hpp")
def nvmlDeviceGetDecoderUtilization(sim, target, out, period):
    return _codec(sim, target, out, period, "decoder")


# --- memory ------------------------------------------------------------------------


def _memory(sim, target):
    return target.device.memory(sim.now(), target.mig)


@nvml("hp")
def nvmlDeviceGetMemoryInfo(sim, target, out):
    total, reserved, used = _memory(sim, target)
    info = struct_at(pynvml.c_nvmlMemory_t, out)
    # The v1 struct folds reserved memory into "used".
    info.total, info.used, info.free = total, used + reserved, total - used - reserved
    return OK


@nvml("hp")
def nvmlDeviceGetMemoryInfo_v2(sim, target, out):
    total, reserved, used = _memory(sim, target)
    info = struct_at(pynvml.c_nvmlMemory_v2_t, out)
    info.total, info.reserved, info.used, info.free = total, reserved, used, total - used - reserved
    return OK


@nvml("hp")
def nvmlDeviceGetBAR1MemoryInfo(sim, target, out):
    total = target.device.spec["bar1_mib"] * MIB
    used = min(total, 2 * MIB + target.device.memory_used(sim.now()) // 64)
    info = struct_at(pynvml.c_nvmlBAR1Memory_t, out)
    info.bar1Total, info.bar1Used, info.bar1Free = total, used, total - used
    return OK


# --- thermal and power -------------------------------------------------------------


@nvml("hup")
def nvmlDeviceGetTemperature(sim, target, sensor, out):
    if sensor != pynvml.NVML_TEMPERATURE_GPU:
        return NOT_SUPPORTED
    put_uint(out, target.device.temperature(sim.now()))
    return OK


@nvml("hup")
def nvmlDeviceGetTemperatureThreshold(sim, target, kind, out):
    thresholds = {
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown_c",
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown_c",
        pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "memory_max_c",
        pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max_c",
    }
    key = thresholds.get(kind)
    if key is None or key not in target.device.spec.facts:
        return NOT_SUPPORTED
    put_uint(out, target.device.spec[key])
    return OK


@nvml("hp")
def nvmlDeviceGetFanSpeed(sim, target, out):
    if not target.device.spec.get("fans"):
        return NOT_SUPPORTED
    put_uint(out, target.device.fan_speed(sim.now()))
    return OK


@nvml("hp")
def nvmlDeviceGetPowerUsage(sim, target, out):
    put_uint(out, target.device.power_mw(sim.now()))
    return OK


@nvml("hp")
def nvmlDeviceGetEnforcedPowerLimit(sim, target, out):
    put_uint(out, target.device.spec["power_limit_w"] * 1000)
    return OK


@nvml("hp")
def nvmlDeviceGetTotalEnergyConsumption(sim, target, out):
    return _counter(sim, target, out, "energy_mj", "energy", put_ulonglong)


def _counter(sim, target, out, key, feature, put=put_uint):
    """A counter the field values give too, where the device has the feature behind it."""
    if feature is not None and not target.device.spec.get(feature):
        return NOT_SUPPORTED
    put(out, int(target.device.counters(sim.now())[key]))
    return OK


# --- clocks ------------------------------------------------------------------------


@nvml("hup")
def nvmlDeviceGetClockInfo(sim, target, kind, out):
    put_uint(out, target.device.clock(CLOCK_KINDS[kind], sim.now()))
    return OK


@nvml("hup")
def nvmlDeviceGetMaxClockInfo(sim, target, kind, out):
    put_uint(out, target.device.spec["clocks_max"][CLOCK_KINDS[kind]])
    return OK


@nvml("hp")
def nvmlDeviceGetPerformanceState(sim, target, out):
    put_uint(out, target.device.performance_state(sim.now()))
    return OK


@nvml("hp")
def nvmlDeviceGetCurrentClocksEventReasons(sim, target, out):
    put_ulonglong(out, target.device.clock_event_reasons(sim.now()))
    return OK


@nvml("hp")
def nvmlDeviceGetCurrentClocksThrottleReasons(sim, target, out):
    return nvmlDeviceGetCurrentClocksEventReasons(sim, target, out)


# --- PCIe and NVLink ---------------------------------------------------------------


@nvml("hup")
def nvmlDeviceGetPcieThroughput(sim, target, counter, out):
    direction = "tx" if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else "rx"
    put_uint(out, target.device.pcie_kb_per_s(direction, sim.now()))
    return OK


def _pcie(sim, target, out, key):
    put_uint(out, target.device.pcie_link(sim.now())[key])
    return OK


@nvml("hp")
def nvmlDeviceGetCurrPcieLinkGeneration(sim, target, out):
    return _pcie(sim, target, out, "generation")


@nvml("hp")
def nvmlDeviceGetCurrPcieLinkWidth(sim, target, out):
    return _pcie(sim, target, out, "width")


@nvml("hp")
def nvmlDeviceGetMaxPcieLinkGeneration(sim, target, out):
    put_uint(out, target.device.spec["pcie"]["generation"])
    return OK


@nvml("hp")
def nvmlDeviceGetMaxPcieLinkWidth(sim, target, out):
    put_uint(out, target.device.spec["pcie"]["width"])
    return OK


@nvml("hp")
def nvmlDeviceGetPcieReplayCounter(sim, target, out):
    return _counter(sim, target, out, "pcie_replay", None)


def _link_refused(device, link: int):
    """How a driver refuses a link: NOT_SUPPORTED on a GPU without NVLink, INVALID_ARGUMENT past the
    GPU's own count (seen on GB200: 18 links, where nvml.h's NVML_NVLINK_MAX_LINKS is 36); None for a link it has."""
    links = device.spec.get("nvlink_links", 0)
    if not links:
        return NOT_SUPPORTED
    return pynvml.NVML_ERROR_INVALID_ARGUMENT if link >= links else None


@nvml("hup")
def nvmlDeviceGetNvLinkState(sim, target, link, out):
    refused = _link_refused(target.device, link)
    if refused is not None:
        return refused
    # Enabled or disabled only: a link up with its traffic disabled is enabled.
    put_uint(out, int(target.device.nvlink_state(link, sim.now()) != 0))
    return OK


NVLINK_ERROR_COUNTERS = {
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "nvlink_replay",
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "nvlink_recovery",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "nvlink_crc_flit",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "nvlink_crc_data",
}


@nvml("huup")
def nvmlDeviceGetNvLinkErrorCounter(sim, target, link, counter, out):
    refused = _link_refused(target.device, link)
    if refused is not None:
        return refused
    # NVML's change log (v570): not supported on Blackwell, whose NVLink 5 counts errors otherwise.
    if counter not in NVLINK_ERROR_COUNTERS or target.device.nvlink_version >= 5:
        return NOT_SUPPORTED
    put_ulonglong(out, target.device.nvlink_link_counters(sim.now())[NVLINK_ERROR_COUNTERS[counter]][link])
    return OK


# --- ECC and page retirement -------------------------------------------------------


@nvml("huup")
def nvmlDeviceGetTotalEccErrors(sim, target, error_type, counter_type, out):
    # The volatile counts restart when the driver loads; the aggregate ones last the GPU's life (nvml.h,
    # nvmlEccCounterType_t).
    key = "ecc_sbe" if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else "ecc_dbe"
    if counter_type == pynvml.NVML_AGGREGATE_ECC:
        key += "_aggregate"
    return _counter(sim, target, out, key, "ecc", put_ulonglong)


@nvml("hupp")
def nvmlDeviceGetRetiredPages(sim, target, cause, count_ptr, addresses_ptr):
    if not target.device.spec.get("page_retirement"):
        return NOT_SUPPORTED
    key = "retired_sbe" if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS else "retired_dbe"
    pages = int(target.device.counters(sim.now())[key])
    capacity = ctypes.c_uint.from_address(count_ptr).value
    put_uint(count_ptr, pages)
    if pages and (addresses_ptr is None or capacity < pages):
        return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    if pages:
        addresses = array_at(ctypes.c_ulonglong, pages).from_address(addresses_ptr)
        for slot in range(pages):
            addresses[slot] = 0x1000 * (slot + 1 + cause * 0x10000)
    return OK


@nvml("hp")
def nvmlDeviceGetRetiredPagesPendingStatus(sim, target, out):
    return _counter(sim, target, out, "retired_pending", "page_retirement")


# --- row remapping -----------------------------------------------------------------


@nvml("hpppp")
def nvmlDeviceGetRemappedRows(sim, target, corrected, uncorrected, pending, failure):
    if not target.device.spec.get("row_remapping"):
        return NOT_SUPPORTED
    counters = target.device.counters(sim.now())
    put_uint(corrected, counters["remap_cor"])
    put_uint(uncorrected, counters["remap_unc"])
    put_uint(pending, counters["remap_pending"])
    put_uint(failure, counters["remap_failure"])
    return OK


# --- MIG ---------------------------------------------------------------------------


@nvml("hpp")
def nvmlDeviceGetMigMode(sim, target, current, pending):
    if not target.device.spec.get("mig_capable"):
        return NOT_SUPPORTED
    mode = int(bool(target.device.mig))
    put_uint(current, mode)
    # nvml.h: the pending mode is the one the GPU takes at its next unbind or reset (nvmlDeviceSetMigMode
    # set it while the GPU was in use); a device's `mig_mode_pending` (0 or 1) is such a mode.
    put_uint(pending, int(target.device.spec.get("mig_mode_pending", mode)))
    return OK


@nvml("hp")
def nvmlDeviceGetMaxMigDeviceCount(sim, target, out):
    if not target.device.spec.get("mig_capable"):
        return NOT_SUPPORTED
    # A real H100 answers 0 while MIG mode is off.
    put_uint(out, 7 if target.device.mig else 0)
    return OK


@nvml("hup")
def nvmlDeviceGetMigDeviceHandleByIndex(sim, target, index, out):
    if index >= len(target.device.mig):
        return pynvml.NVML_ERROR_NOT_FOUND
    put_pointer(out, sim.handle_of(target.device, target.device.mig[index]))
    return OK


@nvml("hp")
def nvmlDeviceIsMigDeviceHandle(sim, target, out):
    put_uint(out, int(target.mig is not None))
    return OK


@nvml("hp")
def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(sim, target, out):
    if target.mig is None:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    put_pointer(out, sim.handle_of(target.device))
    return OK


@nvml("hp")
def nvmlDeviceGetGpuInstanceId(sim, target, out):
    if target.mig is None:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    put_uint(out, target.mig.spec.gpu_instance_id)
    return OK


@nvml("hup")
def nvmlDeviceGetGpuInstanceById(sim, target, gpu_instance_id, out):
    """A GPU instance of a GPU in MIG mode, by ID. Its handle is the handle of the instance's (first)
    MIG device: nothing the check does tells the two kinds of handle apart."""
    if target.mig is not None:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    if not target.device.mig:
        return pynvml.NVML_ERROR_NOT_SUPPORTED
    for instance in target.device.mig:
        if instance.spec.gpu_instance_id == gpu_instance_id:
            put_pointer(out, sim.handle_of(target.device, instance))
            return OK
    return pynvml.NVML_ERROR_NOT_FOUND


@nvml("hp")
def nvmlGpuInstanceGetInfo(sim, target, out):
    spec = target.mig.spec if target.mig is not None else None
    if spec is None or spec.profile_id is None or spec.placement is None:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    info = struct_at(pynvml.c_nvmlGpuInstanceInfo_t, out)
    info.id = spec.gpu_instance_id
    info.profileId = spec.profile_id
    info.placement.start, info.placement.size = spec.placement
    return OK


@nvml("hp")
def nvmlDeviceGetComputeInstanceId(sim, target, out):
    if target.mig is None:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    put_uint(out, target.mig.spec.compute_instance_id)
    return OK
