"""The batched nvmlDeviceGetFieldValues call: every wanted field of a device in one call.

A field the driver refuses (per-entry NOT_SUPPORTED, INVALID_ARGUMENT, ...) is remembered by the
device's `FieldBatch` and never asked again until NVML restarts; `readings` then reads it another way. So
is a counter that must be 64 bits wide and comes back in 32: it wraps too often to measure an
interval by.

The array of entries is built once per device and set of fields and handed to NVML again each
run, and the answers are read back in one pass over its bytes: pynvml builds the array anew
each call and converts every attribute of every entry in Python, which over the ~70 entries of
an H100 (18 NVLink links) was the largest CPU cost a run had outside the driver.
"""

import ctypes
import logging
import struct
import sys
from typing import Callable, Dict, FrozenSet, Optional, Set, Tuple

import pynvml

from gpu_monitoring.nvml import array_room
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.errors import GpuLost
from gpu_monitoring.nvml.library import Query, answered, plain

log = logging.getLogger(__name__)

FieldKey = Tuple[str, int]  # (value name, scope: a link number, 0 for device-wide values)

_FIELD_REFUSED = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_NO_PERMISSION,
}
# One entry of the array as bytes: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn,
# and the 8-byte value union read as an unsigned integer, which the value type then reinterprets.
_ENTRY = struct.Struct("=IIqqIIQ")
_WORDS = _ENTRY.size // 8
# Where an entry's 32-bit value (uiVal, the union's low half) sits among its 32-bit words.
_UINT_WORD = 8 if sys.byteorder == "little" else 9
_DOUBLE = struct.Struct("=d")
_SUCCESS = pynvml.NVML_SUCCESS
_UNSIGNED_LONG_LONG = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_NARROW = {pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_SIGNED_INT,
           pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT}


def _signed(bits: int) -> Callable[[int], int]:
    return lambda raw: (raw & ((1 << bits) - 1)) - ((raw >> (bits - 1) & 1) << bits)


def _uint(raw: int) -> int:
    return raw & 0xFFFFFFFF


_DECODE: Dict[int, Callable[[int], float]] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: lambda raw: _DOUBLE.unpack(raw.to_bytes(8, "little"))[0],
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: _uint,
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: lambda raw: raw,
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: lambda raw: raw,
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: _signed(64),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: _signed(32),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: lambda raw: raw & 0xFFFF,
}


FieldValue = plain(pynvml.c_nvmlFieldValue_t)
assert ctypes.sizeof(FieldValue) == _ENTRY.size, "nvmlFieldValue_t is not laid out as expected"


class Values(Dict[FieldKey, float]):
    """A device's values of one run by key, when NVML took the newest of them (µs, NVML's own clock,
    which counter rates are measured by), and how many NVLink links the device has. A MIG device
    reads no fields: its values are empty and taken at 0."""

    timestamp_us = 0
    links = 0


class Request:
    """The keys asked, in order, and the array NVML fills. It is built for a set of wanted keys and
    the refusals known then, and serves every run until either changes."""

    def __init__(self, wanted: FrozenSet[FieldKey], refused: Set[FieldKey], field_id: Callable[[FieldKey], int],
                 wide: Callable[[FieldKey], bool]) -> None:
        self.wanted = wanted
        self.refusals = len(refused)
        self.keys = tuple(sorted(wanted - refused))
        self.wide = frozenset(filter(wide, self.keys))  # counters a 32-bit answer is no use for
        self.entries = array_room.array_type(FieldValue, len(self.keys))()
        for entry, key in zip(self.entries, self.keys):
            entry.fieldId, entry.scopeId = field_id(key), key[1]
        self.query = Query("nvmlDeviceGetFieldValues", [], answered, (ctypes.c_int32(len(self.keys)), self.entries))
        # The entries as 64-bit words, five per entry: ids, timestamp, latency, type and status, value.
        self.words = memoryview(self.entries).cast("B").cast("Q")
        self.timestamps = memoryview(self.entries).cast("B").cast("q")[1::_WORDS]
        self.uint_values = memoryview(self.entries).cast("B").cast("I")[_UINT_WORD::_WORDS * 2]
        # Each entry's type-and-status word when every entry last answered, and where those types
        # need decoding: while they stay the same, a run decodes only those entries, the
        # unsigned ints among them (by position) read straight from their 32-bit words.
        self.answered: Optional[list] = None
        self.uints: Tuple[Tuple[FieldKey, ...], Tuple[int, ...]] = ((), ())
        self.decoders: Tuple[Tuple[int, Callable[[int], float]], ...] = ()
        # What nvml.readings calls for the wanted keys this request leaves out, and whether the call
        # itself was refused when it worked that out.
        self.fallbacks: Optional[Tuple[bool, tuple]] = None


class FieldBatch:
    """One device's nvmlDeviceGetFieldValues over an NVML session: the request handed to NVML each
    run, the keys the driver refused, and when NVML took the newest values."""

    def __init__(
        self, device: NvmlDevice, field_id: Callable[[FieldKey], int], wide: Callable[[FieldKey], bool]
    ) -> None:
        self.device = device
        self.refused: Set[FieldKey] = set()
        self.timestamp_us = 0
        self.request: Optional[Request] = None
        self._field_id = field_id
        self._wide = wide

    def read(self, wanted: FrozenSet[FieldKey]) -> Values:
        """One call for every wanted key not refused before; keys it refuses drop out for good, and
        so do the `wide` ones (64-bit counters) it answers in 32 bits."""
        request = self._request(wanted)
        if not request.keys or self.device.ask(request.query) is None:
            return Values()
        if request.words[3::_WORDS].tolist() != request.answered:
            return self._decode_each(request)
        raw = request.words[4::_WORDS].tolist()
        values = Values(zip(request.keys, raw))
        uint_keys, positions = request.uints
        if uint_keys:
            values.update(zip(uint_keys, map(request.uint_values.tolist().__getitem__, positions)))
        for index, decode in request.decoders:
            values[request.keys[index]] = decode(raw[index])
        self.timestamp_us = max(self.timestamp_us, max(request.timestamps))
        return values

    def refuses(self, key: FieldKey) -> bool:
        """Whether the batch will never answer `key`: the field, or the whole call, is refused."""
        return key in self.refused or self.call_refused()

    def call_refused(self) -> bool:
        return self.request is not None and self.device.refuses(self.request.query)

    def _request(self, wanted: FrozenSet[FieldKey]) -> Request:
        request = self.request
        if request is None or request.wanted is not wanted or request.refusals != len(self.refused):
            if request is not None:
                self.device.forget(request.query)
            request = self.request = Request(wanted, self.refused, self._field_id, self._wide)
        return request

    def _decode_each(self, request: Request) -> Values:
        """Entry by entry: statuses, refusals and value types as they come; remembers the layout when all answered."""
        values = Values()
        decoders = []
        newest = self.timestamp_us
        entries = _ENTRY.iter_unpack(request.entries)
        for index, (key, (_, _, timestamp, _, value_type, status, raw)) in enumerate(zip(request.keys, entries)):
            if status != _SUCCESS:
                self._failed(key, status)
                continue
            if value_type in _NARROW and key in request.wide:
                self.refused.add(key)
                log.info("%r: field %s (scope %d) is a 32-bit counter, which wraps within an interval under load; "
                         "read another way from now on", self.device, *key)
                continue
            # Most fields are 64-bit counters, which need no decoding.
            if value_type != _UNSIGNED_LONG_LONG:
                decode = _DECODE.get(value_type, int)
                decoders.append((index, decode))
                raw = decode(raw)
            values[key] = raw
            newest = max(newest, timestamp)
        self.timestamp_us = newest
        if len(values) == len(request.keys):
            uints = [(request.keys[index], index) for index, decode in decoders if decode is _uint]
            request.uints = tuple(key for key, _ in uints), tuple(index for _, index in uints)
            request.decoders = tuple((index, decode) for index, decode in decoders if decode is not _uint)
            request.answered = request.words[3::_WORDS].tolist()
        return values

    def _failed(self, key: FieldKey, status: int) -> None:
        if status == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLost(f"field {key[0]}: GPU is lost")
        if status in _FIELD_REFUSED:
            self.refused.add(key)
            log.debug("%r: field %s (scope %d) not available; not asked again", self.device, *key)
