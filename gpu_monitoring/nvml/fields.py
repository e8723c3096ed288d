"""The batched nvmlDeviceGetFieldValues call: every wanted field of a device in one call.

A field the driver refuses (per-entry NOT_SUPPORTED, INVALID_ARGUMENT, ...) is remembered on
the device and never asked again until NVML restarts; `readings` then reads it another way.
"""

import logging
from typing import TYPE_CHECKING, Any, Dict, Tuple

import pynvml

from .errors import CannotAnswer, GpuLost

if TYPE_CHECKING:
    from .device import Device

log = logging.getLogger(__name__)

FieldKey = Tuple[str, int]  # (value name, scope: a link number, 0 for device-wide values)

_FIELD_REFUSED = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_NO_PERMISSION,
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


def request(device: "Device", field_ids: Dict[FieldKey, int]) -> Dict[FieldKey, float]:
    """One call for every key not refused before (key -> field ID); keys it refuses drop out."""
    wanted = sorted(key for key in field_ids if key not in device.refused_fields)
    if not wanted:
        return {}
    try:
        entries = device.call("nvmlDeviceGetFieldValues", [(field_ids[key], key[1]) for key in wanted])
    except CannotAnswer:
        return {}
    values = {}
    for key, entry in zip(wanted, entries):
        if entry.nvmlReturn == pynvml.NVML_SUCCESS:
            values[key] = decode(entry)
            device.fields_timestamp_us = max(device.fields_timestamp_us, entry.timestamp)
        elif entry.nvmlReturn == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLost(f"field {key[0]}: GPU is lost")
        elif entry.nvmlReturn in _FIELD_REFUSED:
            device.refused_fields.add(key)
            log.debug("%r: field %s (scope %d) not available; not asked again", device, *key)
    return values


def refused(device: "Device", key: FieldKey) -> bool:
    """Whether the batch will never answer `key` on this device: the field, or the whole call, is refused."""
    return key in device.refused_fields or device.refuses("nvmlDeviceGetFieldValues")


def decode(entry: Any) -> float:
    """The number in an nvmlFieldValue_t, whatever member of the union holds it."""
    return getattr(entry.value, _UNION_MEMBER.get(entry.valueType, "ullVal"))
