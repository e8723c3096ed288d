"""NVML queries that fill a caller's array (processes, process samples, retired pages), in one call.

pynvml asks each of these twice every time: once for the count, once to fill an array of that
size. Here the array is sized from the counts calls reported plus headroom, so a steady state
asks once. When entries outgrow the room, NVML answers INSUFFICIENT_SIZE and writes the count it
needs; the call is made again with that much room and more. The room never shrinks: a real
driver asks room for its whole process-sample buffer (72 entries on an H100) before it writes
the one or two samples there are, so a room fitted to the last answer would cost a second call
every run. The array is kept between calls while the room's size holds: NVML writes it anew
each call, and entries past the count it reports are never read.
"""

import ctypes
import functools
from typing import Any, Callable, List, Optional, Tuple

import pynvml

FIRST_ROOM = 16  # entries before any count is known: more than a GPU usually lists
ATTEMPTS = 4  # entries can appear between two calls; past this many tries the query fails for this run

# The C arguments after the handle, given a pointer to the count and the array.
Arrange = Callable[[Any, Any], Tuple[Any, ...]]


class Room:
    """How many entries the next call of one query on one device makes room for, the array of that
    many it hands NVML, and the count NVML reads the room from and writes the entries to."""

    __slots__ = ("entries", "count", "count_pointer", "_array")

    def __init__(self) -> None:
        self.entries = FIRST_ROOM
        self.count = ctypes.c_uint()
        self.count_pointer = ctypes.byref(self.count)
        self._array: Optional[ctypes.Array] = None

    def fit(self, count: int) -> None:
        # Half as many again (at least 4) for entries that appear before the next call.
        entries = max(count + 4, count + count // 2)
        if entries > self.entries:
            self.entries, self._array = entries, None

    def array(self, struct: type) -> ctypes.Array:
        """The array of `entries` structs, the last call's while its size and struct are the same."""
        if self._array is None or self._array._type_ is not struct:
            self._array = array_type(struct, self.entries)()
        return self._array


def fill(handle: Any, symbol: str, struct: type, room: Room, arrange: Arrange) -> List[Any]:
    """The entries `symbol` writes into the room's array of `struct`; raises pynvml.NVMLError as
    pynvml does. They are views into that array: read them before the room's next call."""
    function = pynvml._nvmlGetFunctionPointer(symbol)
    count = room.count
    for _ in range(ATTEMPTS):
        entries = room.array(struct)
        count.value = room.entries
        status = function(handle, *arrange(room.count_pointer, entries))
        if status not in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_INSUFFICIENT_SIZE):
            raise pynvml.NVMLError(status)
        found = count.value
        room.fit(found)
        if status == pynvml.NVML_SUCCESS:
            return entries[:found]
    raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)


def count(handle: Any, symbol: str, *args: Any) -> int:
    """How many entries `symbol` would fill, from one call with no array (its count argument last but one)."""
    function = pynvml._nvmlGetFunctionPointer(symbol)
    found = ctypes.c_uint(0)
    status = function(handle, *args, ctypes.byref(found), None)
    if status not in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_INSUFFICIENT_SIZE):
        raise pynvml.NVMLError(status)
    return found.value


@functools.lru_cache(maxsize=256)
def array_type(struct: type, length: int) -> type:
    """`struct * length`, made once: ctypes makes a new array type each time, which only the cycle
    collector frees (a few a run per GPU otherwise)."""
    return struct * length
