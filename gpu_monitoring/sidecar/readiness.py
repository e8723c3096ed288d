"""Whether the sidecar can read NVML at all, for its readiness probe, without a snapshot per probe.

The kubelet asks every 15 s. A snapshot taken for the Agent says what NVML could read then; while
none is recent, a probe starts NVML if it is not yet started and asks each GPU one cheap question.
"""

import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple

from gpu_monitoring import snapshot
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.errors import GpuLost, NvmlError
from gpu_monitoring.nvml.session import NvmlSession

# Longer than the Agent's 15 s interval: while an Agent reads snapshots, probes reuse what they found.
FRESH_SECONDS = 20.0
# Well within `healthz`'s 5 s wait for an answer.
LOCK_SECONDS = 3.0


class NvmlReadiness:
    """NVML is readable while it loads, initialises and answers for at least one GPU."""

    def __init__(self, session: NvmlSession, session_lock: threading.Lock,
                 clock: Callable[[], float] = time.monotonic):
        self.session = session
        self.session_lock = session_lock
        self._clock = clock
        self._learnt: Optional[Tuple[float, Optional[str]]] = None  # when, and the problem then (None: readable)

    def learn(self, devices: Sequence[snapshot.Device]) -> None:
        """What a snapshot found."""
        self._remember(_unreadable(len(devices), [(d.index, d.error or "lost") for d in devices if d.lost]))

    def failed(self, error: NvmlError) -> None:
        """A snapshot found NVML unreadable as a whole."""
        self._remember(str(error))

    def problem(self) -> Optional[str]:
        """Why NVML cannot be read (None while it can), as last learnt or probed now."""
        learnt = self._learnt
        if learnt is None or self._clock() - learnt[0] >= FRESH_SECONDS:
            self._remember(self._probe())
            learnt = self._learnt
        return learnt[1]

    def _remember(self, problem: Optional[str]) -> None:
        self._learnt = (self._clock(), problem)

    def _probe(self) -> Optional[str]:
        # A hung NVML call holds the lock: the probe says so rather than hang with it, so that the
        # sidecar still answers (liveness) while it is not ready.
        if not self.session_lock.acquire(timeout=LOCK_SECONDS):
            return f"an NVML call has not returned for over {LOCK_SECONDS:g} s"
        try:
            if not self.session.started:
                self.session.start()
            answers = [(device.index, _lost(device)) for device in self.session.devices]
        except NvmlError as e:  # not loaded, not initialised, or initialisation lost
            return str(e)
        finally:
            self.session_lock.release()
        return _unreadable(len(answers), [(index, error) for index, error in answers if error is not None])


def _lost(device: NvmlDevice) -> Optional[str]:
    if device.handle is None:
        return "NVML gave no handle for this GPU"
    # nvml.h: NVML_ERROR_GPU_IS_LOST, "the GPU has fallen off the bus or has otherwise become
    # inaccessible", is what any call on such a GPU answers; one cheap call tells.
    try:
        device.temperature()
    except GpuLost as e:
        return str(e)
    return None


def _unreadable(count: int, lost: List[Tuple[int, str]]) -> Optional[str]:
    if count == 0:
        return ("NVML lists no GPU: the NVIDIA container runtime shows the container the GPUs that "
                "NVIDIA_VISIBLE_DEVICES names (the chart sets all)")
    if len(lost) < count:
        return None
    return "no GPU can be read: " + "; ".join(f"GPU {index}: {error}" for index, error in lost)
