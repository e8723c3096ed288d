"""The kernel's one-value files (a sysfs attribute, a procfs sysctl), read as cheaply as Python can."""

import os
from typing import Optional

# A sysfs attribute is at most one page (kernel Documentation/filesystems/sysfs.rst, "Reading/Writing
# Attribute Data"); a procfs sysctl such as boot_id is one line.
MAX_VALUE_BYTES = 4096


class SysfsUnavailable(Exception):
    """The sysfs root holds no readable directory where every Linux sysfs has one: a wrong mount."""


def read_value(path: str) -> Optional[str]:
    """The text of a one-value kernel file (a sysfs attribute, a sysctl), stripped; None where it
    cannot be read (gone, no such file, the driver refused the read) or is empty."""
    data = read_bytes(path)
    text = data.decode("ascii", "replace").strip() if data else None
    return text or None


def read_count(path: str) -> Optional[int]:
    """A kernel counter file's decimal number; None where it cannot be read or holds none (an older
    kernel's "N/A (no PMA)")."""
    data = read_bytes(path)
    return int(data) if data and data.strip().isdigit() else None


def read_bytes(path: str) -> Optional[bytes]:
    """A kernel file's first page; None where it cannot be read."""
    # Through the file descriptor alone: a run reads some hundred of these files, and Python's
    # buffered text files cost three times as much CPU a read.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, MAX_VALUE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
