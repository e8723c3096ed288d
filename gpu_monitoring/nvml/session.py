"""Loading libnvidia-ml, initialising NVML once, and starting again when it is lost."""

import logging
from typing import Any, List, Optional

from gpu_monitoring.nvml import library
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.errors import CannotAnswer, GpuLost, LibraryUnavailable, NvmlError, NvmlUninitialized

log = logging.getLogger(__name__)


class NvmlSession:
    """NVML for one check instance or sidecar: init once, devices, versions, shutdown.

    `library` is what to load: None for the dynamic linker's default search, a file path
    (`nvml_library_path`), or an object with C function-pointer attributes (the simulator).
    pynvml keeps the loaded library in a module global, so the last session started in a
    process decides which library every session in it talks to.
    """

    def __init__(self, library: Any = None):
        self._library = library
        self.started = False
        self.devices: List[NvmlDevice] = []
        self.driver_version: Optional[str] = None
        self.nvml_version: Optional[str] = None
        self.cuda_driver_version: Optional[str] = None

    def start(self) -> None:
        library.load(self._library)
        try:
            library.call("nvmlInit")
        except NvmlError as e:
            raise LibraryUnavailable(f"NVML did not initialise: {e} ({self.describe_library()})") from e
        self.started = True
        self.devices = self._enumerate()
        # Versions only change with a driver reload, which restarts the session.
        self.driver_version = self._optional("nvmlSystemGetDriverVersion")
        self.nvml_version = self._optional("nvmlSystemGetNVMLVersion")
        self.cuda_driver_version = _cuda_version(self._optional("nvmlSystemGetCudaDriverVersion"))

    def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        self.devices = []
        try:
            library.call("nvmlShutdown")
        except NvmlError as e:
            log.debug("%s", e)

    def restart(self) -> None:
        self.stop()
        self.start()

    def describe_library(self) -> str:
        if self._library is None:
            return f"{library.DEFAULT_LIBRARY} from the dynamic linker's search path"
        if isinstance(self._library, str):
            return self._library
        return "the simulated NVML library"

    def _enumerate(self) -> List[NvmlDevice]:
        devices = []
        for index in range(self._system("nvmlDeviceGetCount")):
            try:
                devices.append(NvmlDevice(index, library.call("nvmlDeviceGetHandleByIndex", index)))
            except NvmlError as e:
                log.warning("GPU %d has no NVML handle (%s); it is reported as lost", index, e)
                devices.append(NvmlDevice(index, None))
        return devices

    # --- system facts -------------------------------------------------------------------

    def _system(self, function: str) -> Any:
        try:
            return library.call(function)
        except CannotAnswer as e:  # what the node cannot tell leaves every GPU unread
            raise GpuLost(str(e)) from e

    def _optional(self, function: str) -> Optional[Any]:
        try:
            return self._system(function)
        except (GpuLost, NvmlUninitialized):
            return None


def _cuda_version(version: Optional[int]) -> Optional[str]:
    return None if version is None else f"{version // 1000}.{version % 1000 // 10}"
