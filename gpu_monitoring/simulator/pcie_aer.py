"""PCIe Advanced Error Reporting as the Linux kernel shows it: the sysfs counters of each AER-capable
function and the error an `aer` fault stands for.

The counter files are those of kernel Documentation/ABI/testing/sysfs-bus-pci-devices-aer, in the text
drivers/pci/pcie/aer.c's aer_stats_dev_attr writes: a line `<name> <count>` for each error bit the kernel
names (aer_correctable_error_string, aer_uncorrectable_error_string: 16 and 27 bits, as
AER_MAX_TYPEOF_COR_ERRS and AER_MAX_TYPEOF_UNCOR_ERRS size its counters), then `TOTAL_ERR_COR`,
`TOTAL_ERR_FATAL` or `TOTAL_ERR_NONFATAL`. The counts are of errors the function itself sent; the root
port that received them counts them in its `aer_rootport_total_err_*` files, which only root ports have
(aer_stats_attrs_are_visible).
"""

from dataclasses import dataclass
from typing import Dict, Mapping, Tuple

# aer.c's names by bit of the Correctable and the Uncorrectable Error Status registers.
CORRECTABLE = {0: "RxErr", 6: "BadTLP", 7: "BadDLLP", 8: "Rollover", 12: "Timeout", 13: "NonFatalErr",
               14: "CorrIntErr", 15: "HeaderOF"}
UNCORRECTABLE = {0: "Undefined", 4: "DLP", 5: "SDES", 12: "TLP", 13: "FCP", 14: "CmpltTO", 15: "CmpltAbrt",
                 16: "UnxCmplt", 17: "RxOF", 18: "MalfTLP", 19: "ECRC", 20: "UnsupReq", 21: "ACSViol",
                 22: "UncorrIntErr", 23: "BlockedTLP", 24: "AtomicOpBlocked", 25: "TLPBlockedErr",
                 26: "PoisonTLPBlocked"}
# Each severity's file of a function, the names of its lines and its total's; and a root port's total.
DEVICE_FILES = {
    "corrected": ("aer_dev_correctable", CORRECTABLE, "ERR_COR"),
    "nonfatal": ("aer_dev_nonfatal", UNCORRECTABLE, "ERR_NONFATAL"),
    "fatal": ("aer_dev_fatal", UNCORRECTABLE, "ERR_FATAL"),
}
ROOT_PORT_FILES = {"corrected": "aer_rootport_total_err_cor", "nonfatal": "aer_rootport_total_err_nonfatal",
                   "fatal": "aer_rootport_total_err_fatal"}
KERN_ERR, KERN_WARNING, KERN_INFO = 3, 4, 6


@dataclass(frozen=True)
class AerError:
    """One error of a severity as aer.c prints it: the severity's words (aer_error_severity_string), the
    status bit and its name, the layer and agent AER_GET_LAYER_ERROR and AER_GET_AGENT derive from that bit,
    the mask register beside it, and the level it is printed at (KERN_WARNING for a corrected error,
    KERN_ERR for an uncorrectable one)."""

    words: str
    bit: int
    name: str
    layer: str
    agent: str
    mask: int
    level: int


# The error each severity of fault stands for. A receiver error is the commonest corrected one on a
# marginal link; a completion timeout is non-fatal and a data link protocol error fatal by the default
# Uncorrectable Error Severity of the PCIe specification. The masks are the specification's defaults:
# Advisory Non-Fatal, Corrected Internal and Header Log Overflow masked; no uncorrectable error masked.
ERRORS = {
    "corrected": AerError("Corrected", 0, "RxErr", "Physical Layer", "Receiver ID", 0x0000E000, KERN_WARNING),
    "nonfatal": AerError("Uncorrectable (Non-Fatal)", 14, "CmpltTO", "Transaction Layer", "Requester ID", 0,
                         KERN_ERR),
    "fatal": AerError("Uncorrectable (Fatal)", 4, "DLP", "Data Link Layer", "Receiver ID", 0, KERN_ERR),
}

Counts = Mapping[str, int]  # errors by severity


def device_files(counts: Counts) -> Dict[str, str]:
    """{file name: text} of a function's counters, having sent `counts` errors of each severity."""
    return {name: _device_text(names, total, ERRORS[severity].bit, counts.get(severity, 0))
            for severity, (name, names, total) in DEVICE_FILES.items()}


def root_port_files(counts: Counts) -> Dict[str, str]:
    """{file name: text} of a root port's totals of the errors it received (`counts` by severity)."""
    return {name: f"{counts.get(severity, 0)}\n" for severity, name in ROOT_PORT_FILES.items()}


def _device_text(names: Mapping[int, str], total: str, bit: int, errors: int) -> str:
    lines = [f"{name} {errors if index == bit else 0}" for index, name in sorted(names.items())]
    return "\n".join(lines + [f"TOTAL_{total} {errors}"]) + "\n"


def status_line(error: AerError) -> Tuple[int, int]:
    """The error status and mask registers `device [...] error status/mask=` prints for the error."""
    return 1 << error.bit, error.mask
