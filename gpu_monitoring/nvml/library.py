"""The one module that calls into pynvml: loading libnvidia-ml, NVML's C functions by symbol,
pynvml's own bindings, and what each nvmlReturn_t means to the layer above.

What a device is asked is described by a call (a `Query`, `Binding` or `Filling`, declared in
nvml.queries and nvml.processes); `Device.ask` binds it to the device's handle once and asks it,
and every call, prepared or not, answers the same way: a return code, then the value.

pynvml's wrappers look the C symbol up under a lock, allocate the output and convert each
argument on every call, and read structures back through an attribute hook per field. A run
asks about fifteen queries per GPU, so a `Query` says once what a call needs (its symbol, its
C arguments, what it writes) and is bound the first time it is asked: later runs hand NVML
the same argument tuple and read the same memory back. Outputs are written in place, so a
device is read by one thread at a time (each check instance runs one collection at a time; the
sidecar collects on one thread).
"""

import ctypes
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import pynvml

from gpu_monitoring.nvml.array_room import Room
from gpu_monitoring.nvml.errors import CannotAnswer, GpuLost, LibraryUnavailable, NvmlError, NvmlUninitialized

DEFAULT_LIBRARY = "libnvidia-ml.so.1"
SUCCESS = pynvml.NVML_SUCCESS
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
# Answers that will not change until NVML restarts (DESIGN §3): the call is not asked again. A
# structure version the driver does not know (ARGUMENT_VERSION_MISMATCH) stays unknown to it until
# a newer driver is loaded, which restarts NVML: the next older version is asked instead.
REFUSED_FOR_GOOD = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION,
                              pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH})
_LOST = frozenset({pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN})
_ROOM_ATTEMPTS = 4  # entries can appear between two calls; past this many tries the call fails for this run


def describe(status: int) -> str:
    """NVML's words for a return code, as pynvml's exceptions say it."""
    return str(pynvml.NVMLError(status))


def error(function: str, status: int) -> NvmlError:
    """What the layer raises for a failed call: the GPU or NVML lost, or just this answer."""
    message = f"{function}: {describe(status)}"
    if status in _LOST:
        return GpuLost(message)
    if status == pynvml.NVML_ERROR_UNINITIALIZED:
        return NvmlUninitialized(message)
    return CannotAnswer(message)


def refusal_key(function: str, args: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """What a refusal is remembered under: the function and its int and str arguments (a link, a
    clock); other arguments (arrays, C values, GPM samples) do not tell calls apart."""
    if not args:  # most calls: a list would only be built to be empty
        return (function,)
    return (function, *[arg for arg in args if isinstance(arg, (int, str))])


class Bound:
    """A call bound to one handle: `c_function(*argv, *more)` returns an nvmlReturn_t, then
    `value(*outputs)` makes the answer from what it wrote."""

    __slots__ = ("c_function", "argv", "outputs", "value")

    def __init__(self, c_function: Callable[..., int], argv: Tuple[Any, ...], outputs: Tuple[Any, ...],
                 value: Callable[..., Any]) -> None:
        self.c_function = c_function
        self.argv = argv
        self.outputs = outputs
        self.value = value


class Query:
    """One NVML function with fixed arguments, called through its C symbol:
    `function(handle, *args, *outputs)`.

    `args` are C unsigned ints (clock types, sensors) or ctypes objects handed over as they are
    (an array NVML fills, a GPM sample); `outputs` the types NVML writes into; `value` makes the
    answer from the filled outputs; `prepare` sets the outputs up once (a structure's version).
    `key_args` tell apart calls of one function whose arguments do not (versions of a structure,
    each refused on its own). Hashed by identity: a query is made once, a module constant or kept
    by what asks it (a field batch, a GPM sampler).
    """

    __slots__ = ("function", "args", "outputs", "value", "prepare", "key")

    def __init__(self, function: str, outputs: Sequence[type], value: Callable[..., Any],
                 args: Tuple[Any, ...] = (), prepare: Optional[Callable[..., None]] = None,
                 key_args: Tuple[int, ...] = ()) -> None:
        self.function = function
        self.args = args
        self.outputs = tuple(outputs)
        self.value = value
        self.prepare = prepare
        self.key = refusal_key(function, args) + key_args

    def __repr__(self) -> str:
        return f"{self.function}({', '.join(map(str, self.key[1:]))})"

    def bind(self, handle: Any, rooms: Dict[str, Room]) -> Bound:
        outputs = tuple(output() for output in self.outputs)
        if self.prepare is not None:
            self.prepare(*outputs)
        arguments = (ctypes.c_uint(arg) if isinstance(arg, int) else arg for arg in self.args)
        return Bound(_symbol(self.function), (handle, *arguments, *map(ctypes.byref, outputs)), outputs, self.value)


class Binding:
    """One NVML function called through pynvml's own binding, `pynvml.<function>(handle, *args)`,
    and `value` made of its answer: identity and limits, read once a session, where pynvml's
    decoding (strings, versioned structures) is worth more than a prepared call's speed."""

    __slots__ = ("function", "args", "value", "key", "through")

    def __init__(self, function: str, *args: Any, value: Callable[[Any], Any] = lambda answer: answer,
                 through: Optional[Callable[..., Any]] = None) -> None:
        self.function = function
        self.args = args
        self.value = value
        self.key = refusal_key(function, args)
        # A function of this module that reaches `function` through the handle another call gives.
        self.through = through

    def bind(self, handle: Any, rooms: Dict[str, Room]) -> Bound:
        answer = _Answer(self.through or getattr(pynvml, self.function))
        return Bound(answer, (handle, *self.args), (answer,), self._value)

    def _value(self, answer: "_Answer") -> Any:
        return self.value(answer.answer)


class _Answer:
    """A pynvml binding as a C function: it returns the status and keeps the answer."""

    __slots__ = ("binding", "answer")

    def __init__(self, binding: Callable[..., Any]) -> None:
        self.binding = binding
        self.answer: Any = None

    def __call__(self, *argv: Any) -> int:
        try:
            self.answer = self.binding(*argv)
        except pynvml.NVMLError as e:
            return e.value
        except pynvml.NVMLLibraryMismatchError:  # an old driver without the versioned symbol
            return FUNCTION_NOT_FOUND
        return SUCCESS


Arrange = Callable[..., Tuple[Any, ...]]


class Filling:
    """One NVML function that fills a caller's array of `struct` (processes, process samples,
    retired pages) in one call: see nvml.array_room for the room it keeps per device. `arrange` gives
    the C arguments after the handle from the arguments of the ask, a pointer to the count and the
    array; `value` makes the answer of the entries and the arguments of the ask. NOT_FOUND answers
    no entries where `not_found_is_empty` (a sampling query with nothing new since the time asked).
    Versions of one query name the same `room`: an older one takes over the room a newer one left."""

    __slots__ = ("function", "struct", "arrange", "value", "not_found_is_empty", "key", "room")

    def __init__(self, function: str, struct: type, arrange: Arrange, value: Callable[..., Any],
                 not_found_is_empty: bool = False, key_args: Tuple[int, ...] = (), room: str = "") -> None:
        self.function = function
        self.room = room or function
        self.struct = struct
        self.arrange = arrange
        self.value = value
        self.not_found_is_empty = not_found_is_empty
        # The room and the arguments of the ask (a timestamp) do not tell calls apart; `key_args` do.
        self.key = (function, *key_args)

    def bind(self, handle: Any, rooms: Dict[str, Room]) -> Bound:
        room = rooms.get(self.room)
        if room is None:  # not setdefault: a Room is made only for a query not asked before
            room = rooms[self.room] = Room()
        filled = _Filled(self, _symbol(self.function), room)
        return Bound(filled, (handle,), (filled,), self._value)

    def _value(self, filled: "_Filled") -> Any:
        return self.value(filled.entries, *filled.args)


class _Filled:
    """A filling bound to one handle: its room, and the entries and arguments of its last call.
    The entries are views into the room's array: read before the room's next call."""

    __slots__ = ("filling", "c_function", "room", "entries", "args")

    def __init__(self, filling: Filling, c_function: Callable[..., int], room: Room) -> None:
        self.filling = filling
        self.c_function = c_function
        self.room = room
        self.entries: List[Any] = []
        self.args: Tuple[Any, ...] = ()

    def __call__(self, handle: Any, *args: Any) -> int:
        room, count = self.room, self.room.count
        self.args = args
        for _ in range(_ROOM_ATTEMPTS):
            entries = room.array(self.filling.struct)
            count.value = room.entries
            status = self.c_function(handle, *self.filling.arrange(*args, room.count_pointer, entries))
            if status == NOT_FOUND and self.filling.not_found_is_empty:
                self.entries = []
                return SUCCESS
            if status not in (SUCCESS, pynvml.NVML_ERROR_INSUFFICIENT_SIZE):
                return status
            found = count.value
            room.fit(found)
            if status == SUCCESS:
                self.entries = entries[:found]
                return SUCCESS
        return pynvml.NVML_ERROR_INSUFFICIENT_SIZE


class _Unbound:
    """A call whose symbol the library lacks: it answers FUNCTION_NOT_FOUND, and is then refused."""

    def __init__(self, status: int) -> None:
        self.status = status

    def __call__(self, *_argv: Any) -> int:
        return self.status


def _symbol(function: str) -> Callable[..., int]:
    try:
        return pynvml._nvmlGetFunctionPointer(function)
    except pynvml.NVMLError as e:
        return _Unbound(e.value)


Call = Union[Query, Binding, Filling]  # what Device.ask asks


# --- the library and the node ----------------------------------------------------------------


class LibraryPath(str):
    """A libnvidia-ml file's path, with the option that gave it (the check's `nvml_library_path`, the
    sidecar's `--nvml-library-path`): a file that cannot be loaded is named as the operator wrote it."""

    option: str

    def __new__(cls, path: str, option: str) -> "LibraryPath":
        named = super().__new__(cls, path)
        named.option = option
        return named


def load(library: Any) -> None:
    """Make `library` the one pynvml talks to: None for the dynamic linker's default search, a file
    path (a LibraryPath names its option), or an object with C function-pointer attributes (the
    simulator). pynvml keeps it in a module global, so the last one loaded in a process serves every
    session in it."""
    if isinstance(library, str):
        try:
            loaded = ctypes.CDLL(library)
        except OSError as e:
            given = f"{library.option} {library}" if isinstance(library, LibraryPath) else library
            raise LibraryUnavailable(f"could not load {given}: {e}") from e
    else:
        loaded = library
    if loaded is None and isinstance(pynvml.nvmlLib, ctypes.CDLL):
        return  # pynvml already holds the system library
    pynvml.nvmlLib = loaded
    pynvml._nvmlGetFunctionPointer_cache.clear()
    if loaded is None:
        try:
            pynvml._LoadNvmlLibrary()
        except pynvml.NVMLError as e:
            raise LibraryUnavailable(
                f"{DEFAULT_LIBRARY} was not found by the dynamic linker ({e}); is the NVIDIA driver "
                "installed and its library visible (LD_LIBRARY_PATH, the NVIDIA container runtime), "
                "or should its path be given (the check's nvml_library_path, the sidecar's --nvml-library-path)?"
            ) from e


def gpu_instance_info(device: Any, gpu_instance_id: int) -> Any:
    """nvml.h: a GPU instance's profile and placement are asked of the instance's own handle, which
    its GPU gives by the instance's ID."""
    return pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(device, gpu_instance_id))


def call(function: str, *args: Any) -> Any:
    """`pynvml.<function>(*args)` for what is asked of NVML rather than of one device (the system,
    event sets, GPM samples), its failure raised as error() says; bytes come back as text."""
    try:
        answer = getattr(pynvml, function)(*args)
    except pynvml.NVMLError as e:
        raise error(function, e.value) from e
    return answer.decode() if isinstance(answer, bytes) else answer


def wait_for_event(event_set: Any, data: Any, timeout_ms: int) -> bool:
    """Whether an event came into `data` within timeout_ms. No event in time ends every drain, so it
    is a return code read, not an exception pynvml's binding would raise and unwind."""
    status = _symbol("nvmlEventSetWait_v2")(event_set, ctypes.byref(data), ctypes.c_uint(timeout_ms))
    if status == pynvml.NVML_ERROR_TIMEOUT:
        return False
    if status:
        raise error("nvmlEventSetWait_v2", status)
    return True


# --- what calls write into, and how their answers are read ------------------------------------


def plain(structure: type) -> type:
    """A ctypes structure laid out as pynvml's, without its per-attribute Python hooks."""
    name = structure.__name__[2:] if structure.__name__.startswith("c_") else structure.__name__
    return type(name, (ctypes.Structure,), {"_fields_": structure._fields_})


def versioned(version: int) -> Any:
    """What sets a versioned structure's `version` before NVML fills it."""

    def prepare(structure: Any) -> None:
        structure.version = version

    return prepare


def answered() -> bool:
    """The value of a query that writes into its arguments: that it succeeded."""
    return True


def _scalar(output: Any) -> int:
    return output.value


def scalar(function: str, *args: int, output: type = ctypes.c_uint) -> Query:
    """A call that writes one number."""
    return Query(function, [output], _scalar, args)
