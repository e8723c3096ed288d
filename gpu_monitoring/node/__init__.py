"""The node around the GPUs as the kernel shows it: PCI functions, RDMA ports, boot ID."""

from typing import Optional

# A sysfs attribute is at most one page (kernel Documentation/filesystems/sysfs.rst, "Reading/Writing
# Attribute Data"); a procfs sysctl such as boot_id is one line.
MAX_VALUE_BYTES = 4096


class SysfsUnavailable(Exception):
    """The sysfs root holds no readable directory where every Linux sysfs has one: a wrong mount."""


def read_value(path: str) -> Optional[str]:
    """The text of a one-value kernel file (a sysfs attribute, a sysctl), stripped; None where it
    cannot be read (gone, no such file, the driver refused the read) or is empty."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read(MAX_VALUE_BYTES).strip()
    except OSError:
        return None
    return text or None
