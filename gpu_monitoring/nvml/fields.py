"""NVML field IDs by the names collectors use, so one batched call serves them all."""

import pynvml

FIELD_IDS = {
    "energy_mj": pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    "memory_temperature": pynvml.NVML_FI_DEV_MEMORY_TEMP,
    "pcie_replay": pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    "pcie_tx_bytes": pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    "pcie_rx_bytes": pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    "ecc_corrected": pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    "ecc_uncorrected": pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    "remapped_correctable": pynvml.NVML_FI_DEV_REMAPPED_COR,
    "remapped_uncorrectable": pynvml.NVML_FI_DEV_REMAPPED_UNC,
    "remapped_pending": pynvml.NVML_FI_DEV_REMAPPED_PENDING,
    "remapped_failed": pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
    "retired_single_bit": pynvml.NVML_FI_DEV_RETIRED_SBE,
    "retired_double_bit": pynvml.NVML_FI_DEV_RETIRED_DBE,
    "retired_pending": pynvml.NVML_FI_DEV_RETIRED_PENDING,
    "nvlink_link_count": pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
    "nvlink_crc_flit": pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    "nvlink_crc_data": pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    "nvlink_replay": pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    "nvlink_recovery": pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    # Per link: the scope is the link number.
    "nvlink_state": pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
    "nvlink_tx_kib": pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    "nvlink_rx_kib": pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
}

_UNION_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def decode(entry) -> float:
    """The number in an nvmlFieldValue_t, whatever member of the union holds it."""
    return getattr(entry.value, _UNION_MEMBER.get(entry.valueType, "ullVal"))
