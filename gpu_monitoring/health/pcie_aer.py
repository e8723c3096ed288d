"""PCIe AER errors on each GPU's and NIC's link, counted per run, and what they say of its health.

Two records of them (kernel Documentation/PCI/pcieaer-howto.rst):
- sysfs `aer_dev_correctable`, `aer_dev_nonfatal`, `aer_dev_fatal` (Linux 5.1 and later): the errors the
  function itself detected since boot, exact (node.pci reads their totals);
- the kernel's log (drivers/pci/pcie/aer.c): a line per error message a root port received, naming the
  function that sent it. The kernel rate-limits these lines, so they can undercount.
A function's errors are counted in the run whose kernel lines tell of them: those it sent, and those its
parent port (the bridge directly above it in sysfs) reported, which are errors on the same link. Its sysfs
totals, read one run in node.AER_EVERY (the functions take turns), then add what the lines left out: their
growth since the last read, less the lines of the function counted since. So a count is at once what the
log told and, over a few runs, exact.
"""

from typing import Dict, Iterable, List, Optional, Tuple

from gpu_monitoring.health.device_health import Health
from gpu_monitoring.node.driver_gpus import nvml_bus_id
from gpu_monitoring.snapshot import Event, Node
from gpu_monitoring.status import Status

SEVERITIES = ("corrected", "nonfatal", "fatal")
# Corrected errors in one run from which a link is worth a look: a few a day is noise on a busy link.
CORRECTED_BURST = 10

Counts = Dict[str, int]  # by severity


class AerCounter:
    """Counts each function's AER errors run after run; keeps the sysfs totals last read of each function,
    and its lines counted since, as of the last run submitted."""

    def __init__(self) -> None:
        # By function: its totals last read, and its lines counted since.
        self._kept: Dict[str, Tuple[Optional[Counts], Counts]] = {}
        self._next: Dict[str, Tuple[Optional[Counts], Counts]] = {}

    def count(self, node: Node, events: Iterable[Event]) -> Dict[str, Counts]:
        """The run's errors by function (PCI bus ID in NVML's form), GPUs' and NICs', only where there were any."""
        lines = _lines(events)
        found: Dict[str, Counts] = {}
        self._next = {}
        for bus_id, (totals, parent) in _functions(node).items():
            own = lines.get(bus_id)
            counts = _sum(_sum(lines.get(parent) if parent else None, own), self._unlined(bus_id, totals, own))
            if counts:
                found[bus_id] = counts
        return found

    def _unlined(self, bus_id: str, totals: Optional[Counts], own: Optional[Counts]) -> Optional[Counts]:
        """What the function's sysfs totals, where read this run, hold beyond the lines counted since the last read."""
        before, counted = self._kept.get(bus_id, _NOTHING)
        counted = _sum(counted, own) or {}
        if totals is None:  # not read this run, or the kernel has no such files
            self._next[bus_id] = (before, counted) if before is not None else _NOTHING
            return None
        self._next[bus_id] = (totals, {})
        if before is None:
            return None  # the first read: what came before this check started is not this run's
        grown = {s: totals.get(s, 0) - before.get(s, 0) - counted.get(s, 0) for s in SEVERITIES}
        return {s: n for s, n in grown.items() if n > 0} or None

    def commit(self) -> None:
        """The run that counted was submitted: the next counts on from it (a failed run's are counted again)."""
        self._kept = self._next


def judge(health: Health, counts: Optional[Counts], what: str = "") -> None:
    """A fatal error is CRITICAL (the link, and the device behind it, may be gone); an uncorrectable one
    the device survived, or a burst of corrected ones, a WARNING."""
    if not counts:
        return
    where = f" on {what}" if what else ""
    if counts.get("fatal"):
        health.add(Status.CRITICAL, f"{_errors(counts['fatal'], 'fatal uncorrectable')}{where} since the last run: "
                                    "the link failed; reset the device or reboot the node, and check its seating and "
                                    "riser if it repeats")
    if counts.get("nonfatal"):
        health.add(Status.WARNING, f"{_errors(counts['nonfatal'], 'non-fatal uncorrectable')}{where} since the last "
                                   "run: a transaction was lost and recovered")
    if counts.get("corrected", 0) >= CORRECTED_BURST:
        health.add(Status.WARNING, f"{_errors(counts['corrected'], 'corrected')}{where} since the last run: "
                                   "the link retrains or replays; check its seating, riser and cable")


_NOTHING: Tuple[None, Counts] = (None, {})


def _sum(one: Optional[Counts], other: Optional[Counts]) -> Optional[Counts]:
    """Two counts added; None where both are none (a steady run's, for every function)."""
    if not one or not other:
        return one or other or None
    return {s: one.get(s, 0) + other.get(s, 0) for s in SEVERITIES if one.get(s, 0) + other.get(s, 0)}


def _errors(count: int, kind: str) -> str:
    return f"{count:,} {kind} PCIe error{'s' if count != 1 else ''} (AER)"


def _functions(node: Node) -> Dict[str, Tuple[Optional[Counts], Optional[str]]]:
    """GPU and NIC functions: their sysfs totals (None without them) and their parent port, by NVML bus ID."""
    found: Dict[str, Tuple[Optional[Counts], Optional[str]]] = {}
    for function in node.pci_functions or ():
        if function.kind == "gpu":
            found[nvml_bus_id(function.address)] = (function.aer, _bus_id(function.parent))
    for port in node.network_ports or ():
        if port.pci_address:
            found[nvml_bus_id(port.pci_address)] = (port.aer, _bus_id(port.parent))
    return found


def _lines(events: Iterable[Event]) -> Dict[str, Counts]:
    """The kernel's AER lines of the run by the function that sent the error."""
    lines: Dict[str, Counts] = {}
    for event in events:
        if event.kind == "aer" and event.pci_bus_id and event.severity in SEVERITIES:
            counts = lines.setdefault(nvml_bus_id(event.pci_bus_id), {})
            counts[event.severity] = counts.get(event.severity, 0) + 1
    return lines


def _bus_id(address: Optional[str]) -> Optional[str]:
    return nvml_bus_id(address) if address else None


def port_counts(counts: Dict[str, Counts], ports: List) -> Dict[Tuple[str, int], Counts]:
    """Each port's share: the errors of its NIC function (one function may carry two ports)."""
    return {(port.device, port.port): counts[nvml_bus_id(port.pci_address)]
            for port in ports if port.pci_address and nvml_bus_id(port.pci_address) in counts}
