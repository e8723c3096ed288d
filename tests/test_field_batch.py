"""The field batch reads NVML's answers back from the array's bytes: every value type of the
nvmlValue_t union decodes to what pynvml's own structure reads from the same memory."""

import pynvml
import pytest

from gpu_monitoring.nvml import fields

CASES = [
    (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", [0.0, 1.5, -273.15, 1e300]),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", [0, 1, 2**32 - 1]),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", [0, 2**40, 2**64 - 1]),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", [0, 123456789012345, 2**64 - 1]),
    (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", [0, -1, -(2**63), 2**63 - 1]),
    (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", [0, -1, -(2**31), 2**31 - 1]),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", [0, 65535]),
]


@pytest.mark.parametrize("value_type, member, numbers", CASES, ids=[c[1] for c in CASES])
def test_every_value_type_decodes_as_pynvml_reads_it(value_type, member, numbers):
    entries = (pynvml.c_nvmlFieldValue_t * len(numbers))()
    for entry, number in zip(entries, numbers):
        entry.valueType, entry.nvmlReturn, entry.timestamp = value_type, pynvml.NVML_SUCCESS, 7
        entry.value.ullVal = 0xDEADBEEFCAFEF00D  # what a narrower member leaves in the union's other bytes
        setattr(entry.value, member, number)
    unpacked = list(fields._ENTRY.iter_unpack(bytes(entries)))
    decoded = [fields._DECODE[row[4]](row[6]) for row in unpacked]
    assert decoded == [getattr(entry.value, member) for entry in entries] == numbers
    assert [row[2] for row in unpacked] == [7] * len(numbers)
