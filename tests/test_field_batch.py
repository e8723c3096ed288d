"""The field batch reads NVML's answers back from the array's bytes: every value type of the
nvmlValue_t union decodes to what pynvml's own structure reads from the same memory."""

import pynvml
import pytest

from gpu_monitoring.nvml import fields, readings

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


def pynvml_reads(device, keys):
    """What pynvml's own binding reads for `keys` now: {key: value} of the entries that answered."""
    entries = pynvml.nvmlDeviceGetFieldValues(device.handle, [(readings.READINGS[n].field_id, s) for n, s in keys])
    members = {value_type: member for value_type, member, _ in CASES}
    return {key: getattr(entry.value, members[entry.valueType])
            for key, entry in zip(keys, entries) if entry.nvmlReturn == pynvml.NVML_SUCCESS}


def reader_and_device(node, scenario="dgx-h100"):
    simulated = node(scenario).run(2)
    reader = simulated.check.source.reader
    device = reader.session.devices[0]
    return simulated, device, reader._readings[device]


def test_steady_runs_read_what_pynvml_reads(node):
    """Once every entry answered, a run reads the values back without decoding entry by entry: the
    answers, of both value types the simulated driver writes, stay what pynvml reads at that instant."""
    simulated, device, read = reader_and_device(node)
    keys = sorted(read.wanted)
    for _ in range(4):
        simulated.sim.advance(15)
        for entry in read.batch.request.entries:
            entry.value.ullVal = 0xDEADBEEFCAFEF00D  # what a driver writing a narrower member leaves
        assert read.read() == pynvml_reads(device, keys)
    assert read.batch.request.answered is not None
    assert read.batch.request.uints[0], "no entry was an unsigned int: the test would prove nothing"


def test_an_entry_that_stops_answering_leaves_the_batch_and_the_rest_read_on(node):
    simulated, device, read = reader_and_device(node)
    wanted = read.wanted
    simulated.sim.scenario.refused_fields.add(pynvml.NVML_FI_DEV_MEMORY_TEMP)
    simulated.sim.advance(15)
    found = read.read()
    assert ("memory_temperature", 0) not in found
    assert found == pynvml_reads(device, sorted(wanted))
    simulated.sim.advance(15)
    assert read.read() == pynvml_reads(device, sorted(wanted - {("memory_temperature", 0)}))
    assert ("memory_temperature", 0) not in read.batch.request.keys
    # The replaced batch's prepared call went with it: one binding for the one array asked.
    assert [q.function for q in device._bound].count("nvmlDeviceGetFieldValues") == 1
