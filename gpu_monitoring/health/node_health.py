"""The node's health around its GPUs, and its ports' series (DESIGN §13).

Four records of the GPUs are compared: the NVIDIA GPUs on the PCI bus (sysfs), those bound to the
`nvidia` driver, those in the driver's own record (/proc/driver/nvidia/gpus) and those NVML lists, and
`expected_gpus`. A GPU that never came up in the driver raises no XID: this comparison is the only way
to see a node running on 3 of its 4 GPUs. Then the InfiniBand and RoCE ports: down, slower than
expected, flapping (a `link_downed` that grew, which a run before and a run after the flap both miss
otherwise), and fewer up at the expected rate than the node should have. Each port's series carry the rate
it is judged against, for monitors to read rather than a rate of their own.
"""

import fnmatch
import logging
from dataclasses import dataclass
from statistics import multimode
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from gpu_monitoring.health.device_health import SINCE_LAST_RUN, Health
from gpu_monitoring.health.kernel_faults import kernel_record
from gpu_monitoring.health.pcie_aer import Counts, port_counts
from gpu_monitoring.metrics.names import (
    NETWORK_PORT_ERRORS_LINK_DOWNED,
    NETWORK_PORT_ERRORS_LINK_ERROR_RECOVERY,
    NETWORK_PORT_ERRORS_RCV,
    NETWORK_PORT_ERRORS_SYMBOL,
    NETWORK_PORT_ERRORS_XMIT_DISCARDS,
    NETWORK_PORT_EXPECTED_RATE,
    NETWORK_PORT_RATE,
    NETWORK_PORT_THROUGHPUT_RX,
    NETWORK_PORT_THROUGHPUT_TX,
    NETWORK_PORT_UP,
    PCIE_AER_CORRECTED,
    PCIE_AER_FATAL,
    PCIE_AER_NONFATAL,
)
from gpu_monitoring.node.driver_gpus import nvml_bus_id
from gpu_monitoring.node.pci import NVIDIA_DRIVER, PASSED_TO_VM
from gpu_monitoring.snapshot import NetworkPort, PciFunction, Snapshot
from gpu_monitoring.status import Status

log = logging.getLogger(__name__)

# One 400 Gb/s compute port per GPU in NVIDIA's reference systems: DGX/HGX H100 and H200 and DGX B200
# have eight single-port ConnectX-7 for the compute fabric (DGX H100/H200 and DGX B200 user guides,
# "Network ports"), a DGX GB200 compute tray four for its four GPUs (DGX GB200 user guide, "Compute
# Trays": 4x ConnectX-7 single port 400G OSFP). By NVML's product name and the GPUs a node has.
REFERENCE_SYSTEMS = {
    ("NVIDIA H100 80GB HBM3", 8), ("NVIDIA H200", 8), ("NVIDIA B200", 8), ("NVIDIA GB200", 4),
}
REFERENCE_RATE = 400.0
# The counters/ files each error series counts, and the data counters' unit: port_rcv_data and
# port_xmit_data count octets divided by 4 (kernel Documentation/ABI/stable/sysfs-class-infiniband).
ERRORS = {
    "link_downed": NETWORK_PORT_ERRORS_LINK_DOWNED,
    "symbol_error": NETWORK_PORT_ERRORS_SYMBOL,
    "link_error_recovery": NETWORK_PORT_ERRORS_LINK_ERROR_RECOVERY,
    "port_rcv_errors": NETWORK_PORT_ERRORS_RCV,
    "port_xmit_discards": NETWORK_PORT_ERRORS_XMIT_DISCARDS,
}
THROUGHPUT = {"port_rcv_data": NETWORK_PORT_THROUGHPUT_RX, "port_xmit_data": NETWORK_PORT_THROUGHPUT_TX}
BYTES_PER_DATA_WORD = 4
AER_SERIES = {"corrected": PCIE_AER_CORRECTED, "nonfatal": PCIE_AER_NONFATAL, "fatal": PCIE_AER_FATAL}


class NetworkExpectation(NamedTuple):
    ports: Optional[int]  # how many should be up at `rate`; None: no count is judged
    rate: Optional[float]  # the rate, in Gb/s, the expected ports should run at
    # Whether every port should run at `rate` (the option set), not only the expected ones: a reference
    # system's storage and management ports run at rates of their own, and are judged by their peers'.
    every_port: bool = False


def expectation(ports: Union[str, int], rate: Union[str, float], models: Sequence[Optional[str]]) -> NetworkExpectation:
    """The options' values, with `auto` from NVIDIA's reference systems where the node is one."""
    reference = len(set(models)) == 1 and (models[0], len(models)) in REFERENCE_SYSTEMS
    return NetworkExpectation(
        ports=(len(models) if reference else None) if ports == "auto" else int(ports),
        rate=(REFERENCE_RATE if reference else None) if rate == "auto" else float(rate),
        every_port=rate != "auto",
    )


PortSeries = Tuple[List[str], Dict[str, float]]


@dataclass
class NodeVerdict:
    health: Health
    gpus_on_bus: Optional[int]  # NVIDIA GPUs on the PCI bus; None where sysfs could not be read
    ports: List[PortSeries]  # each port's tags and series values


class NodeJudge:
    """Judges one snapshot's node; keeps each port's counters from the run before, for rates and flaps."""

    def __init__(self, sysfs_root: str, expected_gpus: Optional[int], expected_ports: Union[str, int],
                 expected_rate: Union[str, float], exclude: Sequence[str]) -> None:
        self.sysfs_root = sysfs_root
        self.expected_gpus = expected_gpus
        self.expected_ports = expected_ports
        self.expected_rate = expected_rate
        self.exclude = list(exclude)
        self._previous: Dict[Tuple[str, int], Tuple[float, Dict[str, int]]] = {}
        self._told: Optional[str] = None
        self._noted: List[str] = []

    def judge(self, snapshot: Snapshot, nvml_read: bool = True, init_failures: Optional[Mapping[str, str]] = None,
              aer: Optional[Dict[str, Counts]] = None) -> NodeVerdict:
        """`nvml_read` False: NVML could not be read this run (its own service check says why), so the
        GPUs on the bus are judged against the driver's record alone. `init_failures` are the GPUs the kernel's
        log says the driver failed to initialise, by bus ID; `aer` the run's PCIe AER errors by function."""
        health = Health()
        on_bus = self._gpus(health, snapshot, nvml_read, init_failures or {})
        ports = [p for p in snapshot.node.network_ports or () if not self._excluded(p)]
        models = [device.name for device in snapshot.devices]
        wanted = expectation(self.expected_ports, self.expected_rate, models)
        read_at = snapshot.node.read_at if snapshot.node.read_at is not None else snapshot.timestamp
        by_port = port_counts(aer or {}, ports)
        # The rate each port is judged against is sent too (network.port.expected_rate), from this one
        # computation: a monitor that reads it cannot disagree with node.health.
        references = _reference_rates(ports, wanted.rate if wanted.every_port else None)
        series = [self._series(port, read_at, by_port.get((port.device, port.port)), references.get(port.link_layer))
                  for port in ports]
        if snapshot.node.network_ports is not None:  # a node without class/infiniband has nothing to judge
            _network(health, ports, wanted, references, self._previous)
        kernel_record(health, snapshot.events, _nic_ports(ports), aer or {}, snapshot.node.kernel_log_problem)
        self._previous = {(p.device, p.port): (read_at, dict(p.counters)) for p in ports}
        self._note(health.notes)
        return NodeVerdict(health, on_bus, series)

    def _note(self, notes: List[str]) -> None:
        """What is no fault but worth knowing (a GPU passed to a virtual machine): logged once per change."""
        if notes and notes != self._noted:
            log.info("node: %s", "; ".join(notes))
        self._noted = notes

    def _excluded(self, port: NetworkPort) -> bool:
        names = [port.device, f"{port.device}/{port.port}"] + ([port.netdev] if port.netdev else [])
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.exclude for name in names)

    def _gpus(self, health: Health, snapshot: Snapshot, nvml_read: bool,
              init_failures: Mapping[str, str]) -> Optional[int]:
        node = snapshot.node
        if node.pci_functions is None:
            health.add(Status.WARNING, f"sysfs_root {self.sysfs_root} cannot be read ({node.sysfs_problem}): GPUs "
                                       "missing from the PCI bus cannot be seen")
            on_bus = None
        else:
            on_bus = _gpus_on_bus(health, snapshot, self.sysfs_root, nvml_read, init_failures)
        self._tell_sysfs(health)
        found = len(snapshot.devices) if nvml_read else on_bus
        if self.expected_gpus is not None and found is not None and found < self.expected_gpus:
            health.add(Status.CRITICAL, f"{self.expected_gpus} GPUs expected, {found} found")
        return on_bus

    def _tell_sysfs(self, health: Health) -> None:
        """A sysfs_root that cannot show the host's PCI bus is a deployment mistake: logged once per change."""
        problem = next((reason for reason in health.reasons if reason.startswith(f"sysfs_root {self.sysfs_root} ")),
                       None)
        if problem is not None and problem != self._told:
            log.warning("%s", problem)
        self._told = problem

    def _series(self, port: NetworkPort, timestamp: float, aer: Optional[Counts],
                reference: Optional[float]) -> PortSeries:
        """`reference`: the rate the port is judged against (None: its rate is not judged)."""
        values: Dict[str, float] = {NETWORK_PORT_UP: int(_up(port))}
        values.update({AER_SERIES[severity]: count for severity, count in (aer or {}).items()})
        if port.rate_gbps is not None:
            values[NETWORK_PORT_RATE] = port.rate_gbps
        if reference is not None:
            values[NETWORK_PORT_EXPECTED_RATE] = reference
        values.update({name: port.counters[key] for key, name in ERRORS.items() if key in port.counters})
        before = self._previous.get((port.device, port.port))
        if before is not None and timestamp > before[0]:
            for key, name in THROUGHPUT.items():
                now, then = port.counters.get(key), before[1].get(key)
                if now is not None and then is not None and now >= then:
                    values[name] = (now - then) * BYTES_PER_DATA_WORD / (timestamp - before[0])
        return _port_tags(port), values


def _gpus_on_bus(health: Health, snapshot: Snapshot, sysfs_root: str, nvml_read: bool,
                 init_failures: Mapping[str, str]) -> int:
    """Judges each NVIDIA GPU on the PCI bus against the driver's record and, where it was read, NVML's list;
    returns how many are on the bus for this host (not those passed to virtual machines)."""
    node = snapshot.node
    gpus = [f for f in node.pci_functions or () if f.kind == "gpu"]
    if not gpus and snapshot.devices:
        health.add(Status.WARNING, f"sysfs_root {sysfs_root} shows no NVIDIA GPU on the PCI bus while NVML lists "
                                   f"{len(snapshot.devices)}: it is not the host's sysfs (mount the host's /sys "
                                   "read-only and point sysfs_root at it)")
        return 0
    in_nvml = {nvml_bus_id(d.pci_bus_id) for d in snapshot.devices if d.pci_bus_id} if nvml_read else None
    in_driver = None if node.driver_gpus is None else {nvml_bus_id(bus_id) for bus_id in node.driver_gpus}
    here = [f for f in gpus if f.driver != PASSED_TO_VM]
    for function in gpus:
        problem = _missing(function, in_driver, in_nvml)
        failure = init_failures.get(nvml_bus_id(function.address))
        # The driver's own word, where NVML does not show the GPU up (or cannot be read) since it said it.
        if failure and function.driver != PASSED_TO_VM and (problem or not nvml_read):
            problem = f"{function.address} is on the PCI bus; the driver failed to initialise it ({failure})"
        if problem:
            health.add(Status.CRITICAL, problem)
    for function in gpus:
        if function.driver == PASSED_TO_VM:
            health.add(Status.OK, f"{function.address} is bound to {PASSED_TO_VM}: passed to a virtual machine, "
                                  "not missing")
    if nvml_read and len(snapshot.devices) != len(here):
        health.add(Status.CRITICAL, f"NVML lists {len(snapshot.devices)} GPUs, {len(here)} are on the PCI bus")
    return len(here)


def _missing(function: PciFunction, in_driver: Optional[set], in_nvml: Optional[set]) -> Optional[str]:
    """Why a GPU on the bus does not reach NVML, layer by layer; None where it does (or is a VM's)."""
    address = function.address
    if function.driver is None:
        return f"{address} is on the PCI bus but no driver is bound to it"
    if function.driver == PASSED_TO_VM:
        return None
    if function.driver != NVIDIA_DRIVER:
        return f"{address} is bound to {function.driver}, not {NVIDIA_DRIVER}"
    bus_id = nvml_bus_id(address)
    if in_driver is not None and bus_id not in in_driver:
        return f"{address} is bound to {NVIDIA_DRIVER} but the driver did not set it up (not in its GPU record)"
    if in_nvml is not None and bus_id not in in_nvml:
        return f"{address} is in the driver's record but NVML does not list it"
    return None


def _network(health: Health, ports: List[NetworkPort], wanted: NetworkExpectation,
             references: Dict[Optional[str], float],
             previous: Dict[Tuple[str, int], Tuple[float, Dict[str, int]]]) -> None:
    for port in ports:
        reference = references.get(port.link_layer)
        if not _up(port):
            health.add(Status.WARNING, f"{_name(port)} is down (state {port.state}, physical state {port.phys_state})")
        elif port.rate_gbps is not None and reference is not None and port.rate_gbps < reference:
            health.add(Status.WARNING, f"{_name(port)} runs at {port.rate_gbps:g} Gb/s, below {reference:g} Gb/s")
        downs = _grew(port, previous, "link_downed")
        if downs:
            health.add(Status.WARNING, f"{_name(port)} flapped: its link went down {downs} time"
                                       f"{'s' if downs > 1 else ''}{SINCE_LAST_RUN}", hold=f"flap:{_key(port)}")
    if wanted.ports is not None:
        _expected_ports(health, ports, wanted)


def _expected_ports(health: Health, ports: List[NetworkPort], wanted: NetworkExpectation) -> None:
    good = [p for p in ports if _up(p) and (wanted.rate is None or (p.rate_gbps or 0) >= wanted.rate)]
    if len(good) >= (wanted.ports or 0):
        return
    at = f" at {wanted.rate:g} Gb/s" if wanted.rate is not None else ""
    short = ", ".join(f"{_key(p)} {'down' if not _up(p) else f'at {p.rate_gbps:g} Gb/s'}"
                      for p in ports if p not in good)
    health.add(Status.CRITICAL, f"{len(good)} of {wanted.ports} expected InfiniBand/RoCE ports are up{at}"
                                + (f" ({short})" if short else ""))


def _reference_rates(ports: List[NetworkPort], rate: Optional[float]) -> Dict[Optional[str], float]:
    """The rate each link layer's ports are judged against: the rate every port should run at, or else
    the rate most of the node's up ports of that link layer run at (where at least two share it)."""
    layers = {port.link_layer for port in ports}
    if rate is not None:
        return {layer: rate for layer in layers}
    references = {}
    for layer in layers:
        rates = [p.rate_gbps for p in ports if p.link_layer == layer and _up(p) and p.rate_gbps is not None]
        common = max(multimode(rates), default=None)
        if common is not None and rates.count(common) >= 2:
            references[layer] = common
    return references


def _grew(port: NetworkPort, previous: Dict[Tuple[str, int], Tuple[float, Dict[str, int]]], counter: str) -> int:
    before = previous.get((port.device, port.port))
    now = port.counters.get(counter)
    then = before[1].get(counter) if before else None
    return now - then if now is not None and then is not None and now > then else 0


def _nic_ports(ports: List[NetworkPort]) -> Dict[str, List[str]]:
    """The ports of each NIC function, by its bus ID in NVML's form."""
    found: Dict[str, List[str]] = {}
    for port in ports:
        if port.pci_address:
            found.setdefault(nvml_bus_id(port.pci_address), []).append(_name(port))
    return found


def _up(port: NetworkPort) -> bool:
    # kernel Documentation/ABI/stable/sysfs-class-infiniband: state 4 ACTIVE, phys_state 5 LinkUp.
    return port.state == "ACTIVE" and port.phys_state == "LinkUp"


def _key(port: NetworkPort) -> str:
    return f"{port.device}/{port.port}"


def _name(port: NetworkPort) -> str:
    return f"port {_key(port)}" + (f" ({port.netdev})" if port.netdev else "")


def _port_tags(port: NetworkPort) -> List[str]:
    tags = [f"ib_device:{port.device}", f"ib_port:{port.port}"]
    if port.link_layer:
        tags.append(f"link_layer:{port.link_layer.lower()}")
    if port.netdev:
        tags.append(f"netdev:{port.netdev}")
    return tags
