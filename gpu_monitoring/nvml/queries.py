"""The NVML queries a run asks of every device, prepared once per device.

pynvml's wrappers look the C symbol up under a lock, allocate the output and convert each
argument on every call, and read structures back through an attribute hook per field. A run
asks about fifteen of these per GPU, so a `Query` says once what a call needs (its symbol, its
C arguments, what it writes) and `Device.read` binds it to the device the first time: later
runs hand NVML the same argument tuple and read the same memory back.

Outputs are written in place, so a device is read by one thread at a time (each check instance
runs one collection at a time; the sidecar collects on one thread).
"""

import ctypes
import functools
from typing import Any, Callable, Optional, Sequence, Tuple

import pynvml

Output = Any  # a ctypes scalar or structure NVML writes into


def plain(structure: type) -> type:
    """A ctypes structure laid out as pynvml's, without its per-attribute Python hooks."""
    name = structure.__name__[2:] if structure.__name__.startswith("c_") else structure.__name__
    return type(name, (ctypes.Structure,), {"_fields_": structure._fields_})


def refusal_key(function: str, args: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """What a refusal is remembered under: the function and its int and str arguments (a link, a
    clock); other arguments (arrays, rooms, C values, GPM samples) do not tell calls apart."""
    if not args:  # most calls: a list would only be built to be empty
        return (function,)
    return (function, *[arg for arg in args if isinstance(arg, (int, str))])


class Query:
    """One NVML function with fixed arguments: `function(handle, *args, *outputs)`.

    `args` are C unsigned ints (clock types, sensors) or ctypes objects handed over as they are
    (an array NVML fills, a GPM sample); `outputs` the types NVML writes into;
    `value` makes the answer from the filled outputs; `version` is set in the first output
    (versioned structures). Hashed by identity: a query is made once, a module constant or kept
    by what asks it (a field batch, a GPM sampler).
    """

    __slots__ = ("function", "args", "outputs", "value", "version", "key")

    def __init__(self, function: str, outputs: Sequence[type], value: Callable[..., Any],
                 args: Tuple[Any, ...] = (), version: Optional[int] = None) -> None:
        self.function = function
        self.args = args
        self.outputs = tuple(outputs)
        self.value = value
        self.version = version
        self.key = refusal_key(function, args)

    def __repr__(self) -> str:
        return f"{self.function}({', '.join(map(str, self.key[1:]))})"


class Bound:
    """A query bound to one handle: the C function, the argument tuple and the outputs it fills."""

    __slots__ = ("c_function", "argv", "outputs", "value")

    def __init__(self, query: Query, handle: Any) -> None:
        self.c_function = pynvml._nvmlGetFunctionPointer(query.function)  # raises FUNCTION_NOT_FOUND
        self.outputs = tuple(output() for output in query.outputs)
        if query.version is not None:
            self.outputs[0].version = query.version
        arguments = (ctypes.c_uint(arg) if isinstance(arg, int) else arg for arg in query.args)
        self.argv = (handle, *arguments, *map(ctypes.byref, self.outputs))
        self.value = query.value


def answered() -> bool:
    """The value of a query that writes into its arguments: that it succeeded."""
    return True


def _scalar(output: Output) -> int:
    return output.value


def _first(output: Output, _second: Output) -> int:
    return output.value


def _both(first: Output, second: Output) -> Tuple[int, int]:
    return first.value, second.value


def scalar(function: str, *args: int, output: type = ctypes.c_uint) -> Query:
    return Query(function, [output], _scalar, args)


Memory = plain(pynvml.c_nvmlMemory_t)
MemoryV2 = plain(pynvml.c_nvmlMemory_v2_t)
Bar1Memory = plain(pynvml.c_nvmlBAR1Memory_t)
Utilization = plain(pynvml.c_nvmlUtilization_t)


def _memory(info: Any) -> Tuple[int, int, int, Optional[int]]:
    return info.total, info.used, info.free, getattr(info, "reserved", None)


CLOCK_TYPES = {
    "sm": pynvml.NVML_CLOCK_SM,
    "memory": pynvml.NVML_CLOCK_MEM,
    "graphics": pynvml.NVML_CLOCK_GRAPHICS,
    "video": pynvml.NVML_CLOCK_VIDEO,
}
CLOCK = {kind: scalar("nvmlDeviceGetClockInfo", clock) for kind, clock in CLOCK_TYPES.items()}
MAX_CLOCKS = ("sm", "memory")  # the clocks whose maximum is read (once per session)
PERFORMANCE_STATE = scalar("nvmlDeviceGetPerformanceState")
# Drivers before R535 know the mask by its older name.
CLOCK_EVENT_REASONS = (
    scalar("nvmlDeviceGetCurrentClocksEventReasons", output=ctypes.c_ulonglong),
    scalar("nvmlDeviceGetCurrentClocksThrottleReasons", output=ctypes.c_ulonglong),
)
UTILIZATION = Query("nvmlDeviceGetUtilizationRates", [Utilization], lambda u: (u.gpu, u.memory))
# (utilization, sampling period): the period is not used.
ENCODER = Query("nvmlDeviceGetEncoderUtilization", [ctypes.c_uint, ctypes.c_uint], _first)
DECODER = Query("nvmlDeviceGetDecoderUtilization", [ctypes.c_uint, ctypes.c_uint], _first)
# The v2 query adds `reserved` and counts it out of `used`; drivers before R510 have only v1.
MEMORY = (
    Query("nvmlDeviceGetMemoryInfo_v2", [MemoryV2], _memory, version=pynvml.nvmlMemory_v2),
    Query("nvmlDeviceGetMemoryInfo", [Memory], _memory),
)
BAR1 = Query("nvmlDeviceGetBAR1MemoryInfo", [Bar1Memory], lambda b: (b.bar1Total, b.bar1Used))
TEMPERATURE = scalar("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)
FAN_SPEED = scalar("nvmlDeviceGetFanSpeed")
PCIE_GENERATION = scalar("nvmlDeviceGetCurrPcieLinkGeneration")
PCIE_WIDTH = scalar("nvmlDeviceGetCurrPcieLinkWidth")
# (current, pending)
MIG_MODE = Query("nvmlDeviceGetMigMode", [ctypes.c_uint, ctypes.c_uint], _both)


def _own_handle(handle: Output) -> Any:
    # The output is written again by the next call: each MIG device keeps a handle of its own.
    return pynvml.c_nvmlDevice_t.from_buffer_copy(handle)


@functools.cache
def mig_device(slot: int) -> Query:
    """The handle of the MIG device in one slot of its GPU; an empty slot answers NOT_FOUND."""
    return Query("nvmlDeviceGetMigDeviceHandleByIndex", [pynvml.c_nvmlDevice_t], _own_handle, (slot,))
