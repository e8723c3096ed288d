"""Where a PCI function sits (its address, the port at the other end of its link) and its link's AER totals."""

import os
import re
from typing import Dict, Optional, Tuple

from gpu_monitoring.node.kernel_files import read_bytes

# A PCI function's AER counters (kernel Documentation/ABI/testing/sysfs-bus-pci-devices-aer): one file a
# severity, a line per error type, then the total (`TOTAL_ERR_COR 3`), counted since boot.
AER_FILES = (("corrected", "aer_dev_correctable"), ("nonfatal", "aer_dev_nonfatal"), ("fatal", "aer_dev_fatal"))
_AER_TOTAL = re.compile(rb"^TOTAL_ERR_[A-Z]+ (\d+)$", re.MULTILINE)
PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


# A function's AER totals are read one run in this many, the functions taking turns: the kernel's log tells
# of an error at once, and the totals, read later, are exact (health.pcie_aer).
AER_EVERY = 4


class AerTurns:
    """Which functions' AER totals a run reads: every function's on the first run, then a share in turn."""

    def __init__(self) -> None:
        self._run = -1

    def next_run(self) -> None:
        self._run += 1

    def due(self, position: int) -> bool:
        return self._run == 0 or position % AER_EVERY == self._run % AER_EVERY


def aer_paths(function_directory: str) -> Tuple[Tuple[str, str], ...]:
    """(severity, its file) for a function's AER counters."""
    return tuple((severity, os.path.join(function_directory, name)) for severity, name in AER_FILES)


def read_aer(paths: Tuple[Tuple[str, str], ...]) -> Optional[Dict[str, int]]:
    """A function's AER totals by severity; None where the kernel has no such files (before Linux 5.1,
    AER not enabled, or the function has no AER capability). Cost: three reads."""
    totals = {}
    for severity, path in paths:
        match = _AER_TOTAL.search(read_bytes(path) or b"")
        if match is None:
            return None
        totals[severity] = int(match.group(1))
    return totals


def parent_port(function_directory: str) -> Optional[str]:
    """The PCI bridge directly above a function in the device tree: the port at the other end of its link.
    None for a function on a root bus (its parent is the `pci<domain>:<bus>` directory)."""
    try:
        parent = os.path.basename(os.path.dirname(os.path.realpath(function_directory)))
    except OSError:
        return None
    return parent if PCI_ADDRESS.fullmatch(parent) else None
