"""The C boundary: argument kinds, the registry of simulated symbols, writing results.

Every simulated NVML symbol is registered with a signature string, one letter per C
argument: `h` a device handle, `p` a pointer, `u` unsigned int, `i` int, `U` unsigned
long long. The library wraps each one in a ctypes function pointer of that signature, so
pynvml's own argument conversion runs exactly as it does against libnvidia-ml.

Struct layouts are nvml.h's; pynvml's ctypes declarations of them are reused so the
simulator and the bindings can never disagree about an offset.
"""

import ctypes
import functools
from typing import Callable, Dict, NamedTuple

C_TYPES = {
    "h": ctypes.c_void_p,
    "p": ctypes.c_void_p,
    "u": ctypes.c_uint,
    "i": ctypes.c_int,
    "U": ctypes.c_ulonglong,
}


class Symbol(NamedTuple):
    signature: str
    implementation: Callable[..., int]
    restype: type


SYMBOLS: Dict[str, Symbol] = {}


def nvml(signature: str, restype: type = ctypes.c_int) -> Callable:
    """Register the decorated function as the NVML symbol of the same name."""

    def register(fn: Callable[..., int]) -> Callable[..., int]:
        SYMBOLS[fn.__name__] = Symbol(signature, fn, restype)
        return fn

    return register


def prototype(symbol: Symbol):
    return ctypes.CFUNCTYPE(symbol.restype, *(C_TYPES[k] for k in symbol.signature))


def put_uint(address: int, value: int) -> None:
    ctypes.c_uint.from_address(address).value = int(value)


def put_int(address: int, value: int) -> None:
    ctypes.c_int.from_address(address).value = int(value)


def put_ulonglong(address: int, value: int) -> None:
    ctypes.c_ulonglong.from_address(address).value = int(value)


def put_pointer(address: int, value: int) -> None:
    ctypes.c_void_p.from_address(address).value = value


def put_string(address: int, size: int, text: str) -> bool:
    """Copy text with its terminating NUL; False when the buffer is too small."""
    data = text.encode() + b"\0"
    if len(data) > size:
        return False
    ctypes.memmove(address, data, len(data))
    return True


def struct_at(struct_type, address: int):
    return struct_type.from_address(address)


@functools.lru_cache(maxsize=256)
def array_at(struct: type, length: int) -> type:
    """The type of an array of `length` structs, made once (ctypes makes a new one each time,
    which only the cycle collector frees); `array_at(s, n).from_address(a)` reads a caller's array."""
    return struct * length
