"""The room NVML calls that fill a caller's array (processes, process samples, retired pages) are
given, so that each is asked once (nvml.library's `Filling` makes the calls).

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
from typing import Optional

FIRST_ROOM = 16  # entries before any count is known: more than a GPU usually lists


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


@functools.lru_cache(maxsize=256)
def array_type(struct: type, length: int) -> type:
    """`struct * length`, made once: ctypes makes a new array type each time, which only the cycle
    collector frees (a few a run per GPU otherwise)."""
    return struct * length
