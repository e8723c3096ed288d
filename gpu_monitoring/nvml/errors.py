"""What the nvml layer raises. Nothing above the layer sees a pynvml exception."""


class NvmlError(Exception):
    """Base of everything the nvml layer raises."""


class CannotAnswer(NvmlError):
    """This device or function can't answer now (unsupported, missing symbol, no data, a
    transient failure). Collectors skip the value and carry on."""


class GpuLost(NvmlError):
    """The GPU answered GPU_IS_LOST or UNKNOWN: it fell off the bus or its driver state is gone."""


class NvmlUninitialized(NvmlError):
    """NVML lost its initialisation (driver reload); the session must start again."""


class LibraryUnavailable(NvmlError):
    """libnvidia-ml could not be loaded or initialised; the message says what was tried."""
