"""NVML queries that fill a caller's array (processes, process samples, retired pages), in one call.

pynvml asks each of these twice every time: once for the count, once to fill an array of that
size. Here the array is sized from the count the last call reported plus headroom, so a steady
state asks once. When entries outgrow the room, NVML answers INSUFFICIENT_SIZE and writes the
count it needs; the call is made again with that much room and more.
"""

import ctypes
import functools
from typing import Any, Callable, List, Tuple

import pynvml

FIRST_ROOM = 16  # entries before any count is known: more than a GPU usually lists
ATTEMPTS = 4  # entries can appear between two calls; past this many tries the query fails for this run

# The C arguments after the handle, given a pointer to the count and the array.
Arrange = Callable[[Any, Any], Tuple[Any, ...]]


class Room:
    """How many entries the next call of one query on one device makes room for."""

    def __init__(self) -> None:
        self.entries = FIRST_ROOM

    def fit(self, count: int) -> None:
        # Half as many again (at least 4) for entries that appear before the next call.
        self.entries = max(FIRST_ROOM, count + max(4, count // 2))


def fill(handle: Any, symbol: str, struct: type, room: Room, arrange: Arrange) -> List[Any]:
    """The entries `symbol` writes into an array of `struct`; raises pynvml.NVMLError as pynvml does."""
    function = pynvml._nvmlGetFunctionPointer(symbol)
    for _ in range(ATTEMPTS):
        entries = array_type(struct, room.entries)()
        count = ctypes.c_uint(room.entries)
        status = function(handle, *arrange(ctypes.byref(count), entries))
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
