"""Reads from the network that end by a deadline and stop at a size bound.

A per-read timeout bounds only the wait for the next byte: a peer that answers its headers and
then sends one byte at a time would hold the check's run for as long as it liked. Every read the
check makes goes through a Deadline for the whole answer and a limit on its size.
"""

import math
import time
from typing import Callable, List, Optional

MIB = 1024 * 1024
CHUNK_BYTES = 64 * 1024


class ReadLimitExceeded(Exception):
    """The answer ran past its deadline (`reason` timeout) or its size bound (`reason` too_large)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class Deadline:
    """The moment by which a whole request, from connecting to the answer's last byte, must be done."""

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise ValueError(f"a time limit must be a finite number of seconds; got {seconds!r}")
        if seconds <= 0:
            raise ValueError(f"a time limit must be more than 0 seconds; got {seconds!r}")
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left, never 0: once none are left it raises ReadLimitExceeded (timeout)."""
        left = self._end - time.monotonic()
        if left <= 0:
            raise self.passed()
        return left

    def passed(self) -> ReadLimitExceeded:
        """The error for a request this deadline ended, in the same words whichever bound noticed
        first (a socket timeout, a watchdog, this deadline), so a lasting fault is logged once."""
        return ReadLimitExceeded(f"no complete answer within {self.seconds:g}s", "timeout")


def read_bounded(read1: Callable[[int], bytes], deadline: Deadline, limit: int) -> bytes:
    """The body `read1` yields, read piece by piece as it arrives, until it ends, the deadline passes
    or it grows past `limit` bytes."""
    chunks: List[bytes] = []
    size = 0
    while True:
        deadline.remaining()  # raises ReadLimitExceeded once the deadline has passed
        chunk = read1(CHUNK_BYTES)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        check_size(size, limit)
        chunks.append(chunk)


def check_declared_size(content_length: Optional[str], limit: int) -> None:
    """Refuse a body whose Content-Length says it is over `limit` before reading any of it. A length
    that is no number is left to the read, which stops at the limit all the same."""
    try:
        size = int(content_length or 0)
    except ValueError:
        return
    check_size(size, limit)


def check_size(size: int, limit: int) -> None:
    """Raise ReadLimitExceeded (too_large) when `size` bytes are more than `limit`."""
    if size > limit:
        message = f"the answer is larger than {describe_size(limit)}, the most this check reads"
        raise ReadLimitExceeded(message, "too_large")


def describe_size(size: int) -> str:
    return f"{size / MIB:g} MiB" if size >= MIB else f"{size} bytes"
