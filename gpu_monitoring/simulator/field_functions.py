"""Simulated NVML: field values (nvmlDeviceGetFieldValues), from the counters the functions read.

Each field answers from the same SimDevice counters and gauges as its dedicated function, so
a value read either way at one instant is the same. A scenario's `refused_fields` (pynvml
constant names) answer NOT_SUPPORTED per entry, as a driver or configuration that lacks them.
`sim.field_requests` and `sim.field_refusals` count each (device index, field ID) asked and
refused, so tests can tell what the check asks for.
"""

import ctypes
import math

import pynvml

from gpu_monitoring.simulator.abi import array_at, nvml


class _Entry(ctypes.Structure):
    """nvmlFieldValue_t as the driver sees it: plain C memory (pynvml's class adds Python hooks)."""

    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


OK = pynvml.NVML_SUCCESS

FIELD_COUNTERS = {
    pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: ("energy_mj", "energy"),
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: ("pcie_replay", None),
    pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER: ("pcie_recoveries", None),
    pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: ("pcie_tx_bytes", "pcie_byte_counters"),
    pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: ("pcie_rx_bytes", "pcie_byte_counters"),
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: ("ecc_sbe", "ecc"),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: ("ecc_dbe", "ecc"),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: ("ecc_sbe_aggregate", "ecc"),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: ("ecc_dbe_aggregate", "ecc"),
    # The device memory's lifetime counts: where a simulated GPU has its errors.
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_DEV: ("ecc_sbe_aggregate", "ecc"),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_DEV: ("ecc_dbe_aggregate", "ecc"),
    pynvml.NVML_FI_DEV_REMAPPED_COR: ("remap_cor", "row_remapping"),
    pynvml.NVML_FI_DEV_REMAPPED_UNC: ("remap_unc", "row_remapping"),
    pynvml.NVML_FI_DEV_REMAPPED_PENDING: ("remap_pending", "row_remapping"),
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE: ("remap_failure", "row_remapping"),
    pynvml.NVML_FI_DEV_RETIRED_SBE: ("retired_sbe", "page_retirement"),
    pynvml.NVML_FI_DEV_RETIRED_DBE: ("retired_dbe", "page_retirement"),
    pynvml.NVML_FI_DEV_RETIRED_PENDING: ("retired_pending", "page_retirement"),
    pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: ("nvlink_link_count", "nvlink_links"),
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: ("nvlink_crc_flit", "nvlink_links"),
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: ("nvlink_crc_data", "nvlink_links"),
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: ("nvlink_replay", "nvlink_links"),
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: ("nvlink_recovery", "nvlink_links"),
}
# Per-link fields, the link in the scope (nvml.h), by the link counter each answers from.
PER_LINK = {
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "nvlink_tx_kib",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "nvlink_rx_kib",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: "nvlink_replay",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: "nvlink_recovery",
    # NVLink 5 only: a GPU before it has no such counter and refuses them.
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS: "nvlink_effective_errors",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER: "nvlink_effective_ber",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER: "nvlink_symbol_ber",
    **{pynvml.NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_0 + n: f"nvlink_fec_{n}" for n in range(16)},
}
# nvml.h: NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY and _RECOVERY are unsupported on Blackwell and later.
BEFORE_NVLINK5 = {pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY}
# Fields nvml.h numbers by link, links 0-11: the CRC counters' …_L0 to …_L5, then …_L6 to …_L11.
BY_LINK = {
    field_id: ("nvlink_crc_flit" if "FLIT" in name else "nvlink_crc_data", int(name.rpartition("_L")[2]))
    for name, field_id in vars(pynvml).items()
    if name.startswith(("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L"))
}
# Values whose dedicated function answers an unsigned int are written as one (uiVal), the rest as
# 64-bit counters: the check must read each member the value type names.
UNSIGNED_INT_FIELDS = {
    pynvml.NVML_FI_DEV_MEMORY_TEMP,
    pynvml.NVML_FI_DEV_POWER_AVERAGE,
    pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT,
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER,
    pynvml.NVML_FI_DEV_RETIRED_PENDING,
    pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    pynvml.NVML_FI_DEV_C2C_LINK_COUNT,
    pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS,
    # A real H100 on driver 580 answers the PCIe byte counters as 32-bit values that wrap at
    # 4 GiB (many times a second under load); a model may say its driver keeps 64 bits.
    pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
}
NARROW_COUNTERS_UNLESS = {
    pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: "pcie_counter_bits",
    pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: "pcie_counter_bits",
}
# The power fields (185-192) came with NVML 12: older drivers do not know them.
POWER_FIELDS_SINCE_DRIVER = 525
# Lifetime ECC counts of the on-chip locations, which nvmlMemoryLocation_t (nvml.h) counts apart only
# before Turing: from Turing on it counts DRAM and SRAM, and SRAM has no field. Their errors here: none.
ECC_ON_CHIP_FIELDS = {
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_L1, pynvml.NVML_FI_DEV_ECC_DBE_AGG_L1,
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_L2, pynvml.NVML_FI_DEV_ECC_DBE_AGG_L2,
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_REG, pynvml.NVML_FI_DEV_ECC_DBE_AGG_REG,
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TEX, pynvml.NVML_FI_DEV_ECC_DBE_AGG_TEX,
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_CBU,
}
PRE_TURING = ("kepler", "maxwell", "pascal", "volta")
# Each clock-event time counter (nanoseconds): the reason it times and the drivers that answer it
# (first, last + 1), which answer the IDs of their own nvml.h: the perf-policy IDs for the power cap
# and sync boost; the slowdowns at 251-253 in CUDA 12.9 and 13.0's (drivers 575 and 580), at 269-271
# from CUDA 13.1's (driver 590).
ALWAYS, OLD_NUMBERS, NEW_NUMBERS = (0, math.inf), (575, 590), (590, math.inf)
_SW_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown
_HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
_POWER_BRAKE = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
CLOCK_EVENT_TIMES = {
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: (pynvml.nvmlClocksEventReasonSwPowerCap, ALWAYS),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: (pynvml.nvmlClocksEventReasonSyncBoost, ALWAYS),
    251: (_SW_THERMAL, OLD_NUMBERS),
    252: (_HW_THERMAL, OLD_NUMBERS),
    253: (_POWER_BRAKE, OLD_NUMBERS),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: (_SW_THERMAL, NEW_NUMBERS),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: (_HW_THERMAL, NEW_NUMBERS),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: (_POWER_BRAKE, NEW_NUMBERS),
}
# NVML's change log: the recovery action field came with R565, the C2C error counters with R575.
RECOVERY_ACTION_SINCE_DRIVER = 565
# Field 169 came with the NVLink state and C2C fields around it (R525).
PCIE_RECOVERIES_SINCE_DRIVER = 525
C2C_ERRORS_SINCE_DRIVER = 575
C2C_ERRORS = {pynvml.NVML_FI_DEV_C2C_LINK_ERROR_INTR: "interrupt",
              pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY: "replay",
              pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY_B2B: "replay_b2b"}


@nvml("hip")
def nvmlDeviceGetFieldValues(sim, target, count, array):
    if count <= 0:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    now = sim.now()
    device = target.device
    counters = device.counters(now)
    for entry in array_at(_Entry, count).from_address(array):
        sim.field_requests[device.index, entry.fieldId] += 1
        entry.timestamp = int(now * 1e6)
        entry.latencyUsec = 0
        refused = entry.fieldId in sim.scenario.refused_fields
        status = pynvml.NVML_ERROR_NOT_SUPPORTED if refused else _link_refused(device, entry.fieldId, entry.scopeId)
        value = None if status else _field(sim, device, counters, entry.fieldId, entry.scopeId, now)
        if value is None:
            entry.nvmlReturn = status or pynvml.NVML_ERROR_NOT_SUPPORTED
            sim.field_refusals[device.index, entry.fieldId] += 1
            continue
        entry.nvmlReturn = OK
        if isinstance(value, float):
            entry.valueType = pynvml.NVML_VALUE_TYPE_DOUBLE
            entry.value.dVal = value
        elif entry.fieldId in UNSIGNED_INT_FIELDS and not _wide(device, entry.fieldId):
            entry.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            entry.value.uiVal = value & 0xFFFFFFFF
        else:
            entry.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            entry.value.ullVal = value
    return OK


def _wide(device, field_id) -> bool:
    fact = NARROW_COUNTERS_UNLESS.get(field_id)
    return fact is not None and device.spec.get(fact, 32) == 64


def _field(sim, device, counters, field_id, scope, now):
    spec = device.spec
    if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
        return device.memory_temperature(now) if spec.get("memory_temperature") else None
    if field_id in (pynvml.NVML_FI_DEV_POWER_AVERAGE, pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT):
        return _power(sim, device, field_id, scope, now)
    if field_id == pynvml.NVML_FI_DEV_NVLINK_GET_STATE:
        return device.nvlink_state(scope, now)
    if field_id in PER_LINK or field_id in BY_LINK:
        return _link_counter(device, field_id, scope, now)
    if field_id in CLOCK_EVENT_TIMES:
        return _clock_event_ns(sim, device, field_id, now)
    if field_id in ECC_ON_CHIP_FIELDS:
        return 0 if spec.get("ecc") and spec["architecture"] in PRE_TURING else None
    if field_id == pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER and driver_major(sim) < PCIE_RECOVERIES_SINCE_DRIVER:
        return None
    if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
        return device.recovery_action(now) if driver_major(sim) >= RECOVERY_ACTION_SINCE_DRIVER else None
    if field_id in (pynvml.NVML_FI_DEV_C2C_LINK_COUNT, pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS, *C2C_ERRORS):
        return _c2c(sim, device, field_id, scope, now)
    known = FIELD_COUNTERS.get(field_id)
    if known is None:
        return None
    key, feature = known
    if feature is not None and not spec.get(feature):
        return None
    return int(counters[key])


def _clock_event_ns(sim, device, field_id, now):
    reason, (first, after) = CLOCK_EVENT_TIMES[field_id]
    return device.clock_event_ns(reason, now) if first <= driver_major(sim) < after else None


def _link_of(field_id, scope):
    """The link a per-link field asks about; None for a field of the whole GPU."""
    if field_id in BY_LINK:
        return BY_LINK[field_id][1]
    return scope if field_id in PER_LINK or field_id == pynvml.NVML_FI_DEV_NVLINK_GET_STATE else None


def _link_refused(device, field_id, scope):
    """A per-link field's refusal, as a real driver's: NOT_SUPPORTED on a GPU without NVLink,
    INVALID_ARGUMENT past the GPU's own link count (GB200: 18 links, NVML_NVLINK_MAX_LINKS 36)."""
    link = _link_of(field_id, scope)
    if link is None:
        return OK
    links = device.spec.get("nvlink_links", 0)
    if not links:
        return pynvml.NVML_ERROR_NOT_SUPPORTED
    return pynvml.NVML_ERROR_INVALID_ARGUMENT if link >= links else OK


def _link_counter(device, field_id, scope, now):
    name, link = BY_LINK.get(field_id) or (PER_LINK[field_id], scope)
    if field_id in BEFORE_NVLINK5 and device.nvlink_version >= 5:
        return None
    per_link = device.nvlink_link_counters(now).get(name)
    return None if per_link is None else per_link[link]


def _c2c(sim, device, field_id, scope, now):
    """A Grace GPU's C2C links (`c2c_links`), each up; other GPUs have none and answer NOT_SUPPORTED."""
    links = device.spec.get("c2c_links", 0)
    if not links:
        return None
    if field_id == pynvml.NVML_FI_DEV_C2C_LINK_COUNT:
        return links
    if scope >= links:
        return None
    if field_id == pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS:
        return 1
    if driver_major(sim) < C2C_ERRORS_SINCE_DRIVER:
        return None
    base = device.spec.get("counters", {}).get(f"c2c_{C2C_ERRORS[field_id]}", 0)
    return base + (device.c2c_replays(scope, now) if field_id == pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY else 0)


def _power(sim, device, field_id, scope, now):
    """Milliwatts, as nvmlDeviceGetPowerUsage and nvmlDeviceGetEnforcedPowerLimit answer them."""
    if scope != pynvml.NVML_POWER_SCOPE_GPU or driver_major(sim) < POWER_FIELDS_SINCE_DRIVER:
        return None
    if field_id == pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT:
        return device.spec["power_limit_w"] * 1000
    # nvml.h: the 1-s average is "supported on Ampere (except GA100) or newer architectures".
    architecture = device.spec["architecture"]
    ga100 = any(product in device.spec["name"] for product in ("A100", "A30"))
    if architecture in ("kepler", "maxwell", "pascal", "volta", "turing") or (architecture == "ampere" and ga100):
        return None
    return device.power_mw(now)


def driver_major(sim) -> int:
    return int(str(sim.scenario.driver["version"]).split(".")[0])
