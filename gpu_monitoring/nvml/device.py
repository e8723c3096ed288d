"""One GPU (or MIG instance) as NVML sees it: every call made of it goes through `NvmlDevice.ask`,
which learns what the device cannot do.

A call NVML refuses for good on this device (NOT_SUPPORTED, a symbol the driver lacks, no
permission, INVALID_ARGUMENT on a MIG handle) is remembered, per function and arguments, and not
made again until the session restarts. Values come back as plain Python numbers and strings.
"""

import ctypes
import logging
from typing import Any, Dict, List, Optional, Set, Tuple

from gpu_monitoring.nvml import library, queries
from gpu_monitoring.nvml.array_room import Room
from gpu_monitoring.nvml.errors import CannotAnswer

log = logging.getLogger(__name__)


class NvmlDevice(queries.DeviceValues):
    """The mechanics of asking a device; what is asked, and the plain values it gives, are
    nvml.queries' DeviceValues."""

    def __init__(self, index: int, handle: Any, parent: Optional["NvmlDevice"] = None):
        self.index = index
        self.handle = handle
        self.address = handle_address(handle)  # what tells handles apart (events, MIG children)
        self.parent = parent
        self._bound: Dict[library.Call, library.Bound] = {}  # calls asked so far, bound to the handle
        self._rooms: Dict[str, Room] = {}  # array size per query that fills one (nvml.array_room)
        self._refused: Set[Tuple] = set()
        self._refused_names: Optional[List[str]] = None
        self._denied: Set[str] = set()  # refused for want of permission: worth telling, unlike "not supported"
        self._failure: Tuple[Any, str] = (None, "")  # the last call that failed, and why
        self._mig_slots = 0
        self._children: Dict[int, NvmlDevice] = {}

    @property
    def is_mig(self) -> bool:
        return self.parent is not None

    def __repr__(self) -> str:
        where = f"MIG {self.index} of GPU {self.parent.index}" if self.parent else f"GPU {self.index}"
        return f"<{where}>"

    # --- the one way in -----------------------------------------------------------------

    def ask(self, call: library.Call, *args: Any) -> Optional[Any]:
        """The answer to `call` (nvml.queries), bound to this device when first asked; `args` are
        handed over after the bound ones (an event set, a timestamp). None where the device cannot
        answer: refused for good (then never asked again) or failing this time; why_not() says
        which. A lost GPU raises GpuLost, lost NVML NvmlUninitialized."""
        bound = self._bound.get(call)
        if bound is None:
            if call.key in self._refused:
                return None
            bound = self._bound[call] = call.bind(self.handle, self._rooms)
        status = bound.c_function(*bound.argv, *args)
        if status:
            return self._failed(call, status)
        return bound.value(*bound.outputs)

    def _failed(self, call: library.Call, status: int) -> None:
        """A failure that costs only this answer passes, a refusal for good remembered; one that
        costs the GPU or NVML goes up."""
        failure = library.error(call.key[0], status)
        if not isinstance(failure, CannotAnswer):
            raise failure
        self._failure = (call, str(failure))
        if status in library.REFUSED_FOR_GOOD or (self.is_mig and status == library.INVALID_ARGUMENT):
            self._refuse(call.key, status)

    def _refuse(self, key: Tuple, status: int) -> None:
        self._refused.add(key)
        self._refused_names = None
        self._bound = {call: bound for call, bound in self._bound.items() if call.key != key}
        if status == library.NO_PERMISSION:
            self._denied.add(key[0])
        log.debug("%r: %s answered %s; not asking again until NVML restarts", self, key[0], library.describe(status))

    def refuses(self, call: library.Call) -> bool:
        """Whether NVML refused `call` for good on this device."""
        return call.key in self._refused

    def why_not(self, call: library.Call) -> str:
        """Why `call` just gave no answer."""
        if self._failure[0] is call:
            return self._failure[1]
        return f"{call.key[0]} is not available on {self!r}"

    def ask_first(self, *candidates: library.Call) -> Optional[Any]:
        """The answer of the first call the device has not refused for good; newer symbols first."""
        for call in candidates:
            answer = self.ask(call)
            if answer is not None or call.key not in self._refused:
                return answer
        return None

    def denied_functions(self) -> List[str]:
        """The functions NVML refused this process for want of permission."""
        return sorted(self._denied)

    def refused_functions(self) -> List[str]:
        """What NVML refused for good, as `name` or `name(args)` where arguments told the calls apart."""
        if self._refused_names is None:  # every snapshot carries them; they change only with a refusal
            self._refused_names = sorted(
                f"{key[0]}({', '.join(map(str, key[1:]))})" if key[1:] else key[0] for key in self._refused)
        return list(self._refused_names)

    def forget(self, call: library.Call) -> None:
        """Unbind a call that will not be asked again (its arguments were replaced)."""
        self._bound.pop(call, None)

    # --- MIG children -----------------------------------------------------------------------

    def mig_devices(self) -> List["NvmlDevice"]:
        """The MIG devices present now; a child keeps its memo while its handle stays the same."""
        # Learnt once it is known: a GPU answers 0 while MIG mode is off, and the mode can change.
        self._mig_slots = self._mig_slots or self.ask(queries.MAX_MIG_DEVICES) or 0
        found = []
        for slot in range(self._mig_slots):
            handle = self.ask(queries.mig_device(slot))
            if handle is None:  # an empty slot, every run on a partly split GPU
                continue
            known = self._children.get(slot)
            if known is None or known.address != handle_address(handle):
                known = self._children[slot] = NvmlDevice(slot, handle, parent=self)
            found.append(known)
        return found


def handle_address(handle: Any) -> Optional[int]:
    if handle is None:
        return None
    return ctypes.cast(handle, ctypes.c_void_p).value
