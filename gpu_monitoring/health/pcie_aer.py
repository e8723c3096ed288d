"""PCIe AER errors on each GPU's and NIC's link, counted per run, and what they say of its health.

Two records of them (kernel Documentation/PCI/pcieaer-howto.rst):
- sysfs `aer_dev_correctable`, `aer_dev_nonfatal`, `aer_dev_fatal` (Linux 5.1 and later): the errors the
  function itself detected since boot, exact (node.pci reads their totals);
- the kernel's log (drivers/pci/pcie/aer.c): a line per error message a root port received, naming the
  function that sent it. The kernel rate-limits these lines, so they can undercount.
A function's count in a run is the growth of its sysfs totals where it has them, else its lines; and, in
both cases, the lines of errors its parent port (the bridge directly above it in sysfs) detected:
those are errors on the same link, which the function's own totals do not hold.
"""

from collections import Counter
from typing import Dict, Iterable, List, Optional, Tuple

from gpu_monitoring.health.device_health import Health
from gpu_monitoring.health.service_checks import Status
from gpu_monitoring.node.driver_gpus import nvml_bus_id
from gpu_monitoring.snapshot import Event, Node

SEVERITIES = ("corrected", "nonfatal", "fatal")
# Corrected errors in one run from which a link is worth a look: a few a day is noise on a busy link.
CORRECTED_BURST = 10

Counts = Dict[str, int]  # by severity


class AerCounter:
    """Counts each function's AER errors run after run; keeps the sysfs totals of the last run submitted."""

    def __init__(self) -> None:
        self._totals: Dict[str, Counts] = {}
        self._read: Dict[str, Counts] = {}

    def count(self, node: Node, events: Iterable[Event]) -> Dict[str, Counts]:
        """The run's errors by function (PCI bus ID in NVML's form), GPUs' and NICs', only where there were any."""
        functions = _functions(node)
        lines = _lines(events)
        found: Dict[str, Counts] = {}
        totals: Dict[str, Counts] = {}
        for bus_id, (totals_now, parent) in functions.items():
            counts: Counter = Counter(lines.get(parent, {})) if parent else Counter()
            if totals_now is None:
                counts.update(lines.get(bus_id, {}))
            else:
                totals[bus_id] = totals_now
                before = self._totals.get(bus_id, totals_now)
                counts.update({s: totals_now.get(s, 0) - before.get(s, 0) for s in SEVERITIES
                               if totals_now.get(s, 0) > before.get(s, 0)})
            if counts:
                found[bus_id] = dict(counts)
        self._read = totals
        return found

    def commit(self) -> None:
        """The run that counted was submitted: the next counts from its totals (a failed run's are counted again)."""
        self._totals = self._read


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
    lines: Dict[str, Counter] = {}
    for event in events:
        if event.kind == "aer" and event.pci_bus_id and event.severity in SEVERITIES:
            lines.setdefault(nvml_bus_id(event.pci_bus_id), Counter())[event.severity] += 1
    return {bus_id: dict(counts) for bus_id, counts in lines.items()}


def _bus_id(address: Optional[str]) -> Optional[str]:
    return nvml_bus_id(address) if address else None


def port_counts(counts: Dict[str, Counts], ports: List) -> Dict[Tuple[str, int], Counts]:
    """Each port's share: the errors of its NIC function (one function may carry two ports)."""
    return {(port.device, port.port): counts[nvml_bus_id(port.pci_address)]
            for port in ports if port.pci_address and nvml_bus_id(port.pci_address) in counts}
