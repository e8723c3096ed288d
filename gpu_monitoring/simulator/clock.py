"""Scenario time: seconds since the simulated node started."""

import threading
import time


class SimClock:
    """A clock that follows wall time at `speed` and can be moved forward by hand.

    Tests use speed 0 so every value is a pure function of the advances they make;
    the CLI and the sidecar run at speed 1 and advance by the collection interval
    between check runs so rates and timelines show without waiting.
    """

    def __init__(self, speed: float = 1.0, start: float = 0.0):
        self._speed = speed
        self._offset = start
        self._origin = time.monotonic()
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._offset + (time.monotonic() - self._origin) * self._speed

    def set_speed(self, speed: float) -> None:
        with self._lock:
            now = time.monotonic()
            self._offset += (now - self._origin) * self._speed
            self._origin, self._speed = now, speed

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds
