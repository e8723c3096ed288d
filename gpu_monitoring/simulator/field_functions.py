"""Simulated NVML: field values (nvmlDeviceGetFieldValues), from the counters the functions read.

Each field answers from the same SimDevice counters and gauges as its dedicated function, so
a value read either way at one instant is the same. A scenario's `refused_fields` (pynvml
constant names) answer NOT_SUPPORTED per entry, as a driver or configuration that lacks them.
`sim.field_requests` and `sim.field_refusals` count each (device index, field ID) asked and
refused, so tests can tell what the check asks for.
"""

import ctypes

import pynvml

from .abi import array_at, nvml


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
PER_LINK_THROUGHPUT = {
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "nvlink_tx_kib",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "nvlink_rx_kib",
}
# Values whose dedicated function answers an unsigned int are written as one (uiVal), the rest as
# 64-bit counters: the check must read each member the value type names.
UNSIGNED_INT_FIELDS = {
    pynvml.NVML_FI_DEV_MEMORY_TEMP,
    pynvml.NVML_FI_DEV_POWER_AVERAGE,
    pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT,
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
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
        value = None if refused else _field(sim, device, counters, entry.fieldId, entry.scopeId, now)
        if value is None:
            entry.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
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
        return int(device.nvlink_active(scope, now)) if scope < spec.get("nvlink_links", 0) else None
    if field_id == pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER and driver_major(sim) < PCIE_RECOVERIES_SINCE_DRIVER:
        return None
    if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
        return device.recovery_action(now) if driver_major(sim) >= RECOVERY_ACTION_SINCE_DRIVER else None
    if field_id in (pynvml.NVML_FI_DEV_C2C_LINK_COUNT, pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS, *C2C_ERRORS):
        return _c2c(sim, device, field_id, scope, now)
    if field_id in PER_LINK_THROUGHPUT:
        links = spec.get("nvlink_links", 0)
        if scope >= links:
            return None
        return int(counters[PER_LINK_THROUGHPUT[field_id]] / links)
    known = FIELD_COUNTERS.get(field_id)
    if known is None:
        return None
    key, feature = known
    if feature is not None and not spec.get(feature):
        return None
    return int(counters[key])


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
