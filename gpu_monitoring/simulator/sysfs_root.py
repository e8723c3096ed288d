"""A simulated node's sysfs: its PCI functions and RDMA ports, as the Linux kernel shows them.

The tree, laid out as on a real node: one root bus a PCI domain, and each GPU or NIC function behind a
PCIe root port (node_spec's `bridges`, bound to pcieport) whose secondary bus is the function's:

    devices/pci0000:00/<bridge>/<address>/{vendor,device,class}   "0x10de\\n", "0x2330\\n", "0x030200\\n"
                                                         (drivers/pci/pci-sysfs.c: "0x%04x", "0x%06x")
    devices/pci0000:00/<bridge>/<address>/driver -> ../../../../bus/pci/drivers/<driver>  (none while unbound)
    bus/pci/devices/<address> -> ../../../devices/pci0000:00/<bridge>/<address>
    <function>/aer_dev_{correctable,nonfatal,fatal}      GPUs, NICs and their root ports (simulator.pcie_aer)
    <bridge>/aer_rootport_total_err_{cor,nonfatal,fatal}
    <NIC function>/infiniband/<device>/ports/<n>/{state,phys_state,rate,link_layer,counters/*}
    <NIC function>/infiniband/<device>/device -> ../../../<address>
    <NIC function>/net/<interface>/dev_port              the port's number less 1
    class/infiniband/<device>, class/net/<interface>     links to those directories

A port's files are those of kernel Documentation/ABI/stable/sysfs-class-infiniband, in the text
drivers/infiniband/core/sysfs.c writes: state "4: ACTIVE", phys_state "5: LinkUp", rate "400 Gb/sec
(4X NDR)", link_layer, and in counters/ the port's PortCounters, decimal: link_downed (times the
port training state machine failed link error recovery and downed the link), link_error_recovery
(times it recovered), symbol_error, port_rcv_errors, port_xmit_discards, and port_rcv_data and
port_xmit_data in octets divided by 4. The error counters are as wide as the InfiniBand
specification's PortCounters fields (sysfs.c's PORT_PMA_ATTR widths) and stop at their largest value.

`SysfsTree.build()` writes the tree at a scenario time and `update()` brings the files that change
with time (each port's state, rate and counters, the AER counters an `aer` fault grows) to another,
rewriting only those whose text changed,
each by a rename so that a reader never finds one half written. Creating a file is what costs (most
of a millisecond on a slow disk): the tree of a node with 8 GPUs and 10 ports is some 300 of them.
"""

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

from gpu_monitoring.simulator import pcie_aer
from gpu_monitoring.simulator.node_spec import (
    BRIDGE_CLASS,
    BRIDGE_DRIVER,
    INTEL_VENDOR,
    MELLANOX_VENDOR,
    NIC_CLASSES,
    NIC_DRIVER,
    PORT_COUNTER_BITS,
    PORT_FAULTS,
    PORT_RATES,
    ROOT_PORT_DEVICE,
    NodeSpec,
    PciSpec,
    PortSpec,
)
from gpu_monitoring.simulator.scenario import Fault, Scenario

# What each direction carries of a port's traffic: a little less comes back than goes out.
DATA_SHARES = {"port_xmit_data": 1.0, "port_rcv_data": 0.9}
# What a down port reports as its rate. An InfiniBand port has no active speed: rate_show prints
# SDR, the speed it falls back to, on its 4 lanes. mlx5 reports a RoCE port without an operating
# Ethernet protocol as 4X QDR (mlx5_query_port_roce's defaults).
DOWN_RATES = {"InfiniBand": 10, "Ethernet": 40}
# The port's physical state while down: an InfiniBand port keeps polling for a peer; mlx5 reports
# a RoCE port whose interface has no carrier as disabled (mlx5_query_port_roce).
DOWN_PHYS_STATES = {"InfiniBand": "2: Polling", "Ethernet": "3: Disabled"}
ACTIVE, DOWN = "4: ACTIVE", "1: DOWN"
LINK_UP = "5: LinkUp"
# The functions that show AER counters: each is AER-capable, as GPUs, ConnectX NICs and root ports are.
AER_KINDS = ("gpu", "nic", "bridge")


@dataclass(frozen=True)
class PortReading:
    """What a port shows at one instant."""

    up: bool
    rate: int
    counters: Dict[str, int]


def pci_functions(scenario: Scenario) -> List[PciSpec]:
    """Every PCI function of the node the tree shows: the GPUs NVML lists (bound to nvidia), the
    scenario's other functions, the NIC function under each of its RDMA ports, and the root ports."""
    gpus = [
        PciSpec(d.pci_address, "gpu", d.pci_device_id >> 16, int(d.get("pci_class", 0x030200)), "nvidia")
        for d in scenario.devices
    ]
    nics = {
        port.pci: PciSpec(port.pci, "nic", port.pci_device_id, NIC_CLASSES[port.link_layer], NIC_DRIVER,
                          vendor=MELLANOX_VENDOR)
        for port in scenario.node.network
    }
    bridges = [PciSpec(address, "bridge", ROOT_PORT_DEVICE, BRIDGE_CLASS, BRIDGE_DRIVER, vendor=INTEL_VENDOR)
               for address in sorted(set(scenario.node.bridges.values()))]
    return bridges + gpus + scenario.node.pci + list(nics.values())


def aer_counts(scenario: Scenario, now: float) -> Dict[str, Dict[str, int]]:
    """The AER errors each function sent (a GPU) or received (its root port) by `now`, by severity: those
    of the `aer` faults fired by then."""
    counts: Dict[str, Dict[str, int]] = {}
    for fault in scenario.faults:
        if fault.kind == "aer" and fault.at <= now:
            gpu = scenario.devices[fault.device].pci_address
            for address in (gpu, scenario.node.bridge_of(gpu)):
                severities = counts.setdefault(address, {})
                severity = fault.params["severity"]
                severities[severity] = severities.get(severity, 0) + int(fault.params.get("count", 1))
    return counts


def port_reading(port: PortSpec, faults: List[Fault], now: float) -> PortReading:
    """The port at `now`, from its `faults` (the scenario's port faults that name it)."""
    fired = [f for f in faults if f.at <= now]
    downs = [f for f in fired if f.kind in ("port_down", "port_flap") or _unloaded(f)]
    counters = {name: port.counters.get(name, 0) for name in PORT_COUNTER_BITS}
    # link_downed counts the link going down (a flap too). A port_slow retrain only renegotiates the
    # speed: no link error recovery failed, so by sysfs-class-infiniband's definition it counts none.
    counters["link_downed"] += len(downs)
    counters["link_error_recovery"] += sum(1 for f in fired if f.kind == "port_flap")
    for fault in fired:
        for name, added in fault.params.get("counters", {}).items():
            counters[name] += int(added)
    carried = port.traffic_gbps * 1e9 / 8 * (now - sum(_held_down(f, now) for f in downs)) / 4
    for name, share in DATA_SHARES.items():
        counters[name] += int(carried * share)
    slow = [f for f in fired if f.kind == "port_slow" and f.active(now)]
    return PortReading(
        up=not any(f.active(now) for f in downs),
        rate=int(slow[-1].params["rate"]) if slow else port.rate,
        counters={name: min(value, 2 ** PORT_COUNTER_BITS[name] - 1) for name, value in counters.items()},
    )


def _unloaded(fault: Fault) -> bool:
    """A fatal health fault of a NIC: mlx5 unloads the function, and its port is down from then on."""
    return fault.kind == "nic_fault" and fault.params.get("severity") == "fatal"


def _held_down(fault: Fault, now: float) -> float:
    """How long the fault had held its port down by `now`."""
    end = fault.at + fault.duration if fault.duration is not None else math.inf
    return max(0.0, min(now, end) - fault.at)


def port_files(port: PortSpec, reading: PortReading) -> Iterator[Tuple[str, str]]:
    """(path under the port's directory, text) of each file of the port that changes with time."""
    rate = reading.rate if reading.up else DOWN_RATES[port.link_layer]
    yield "state", f"{ACTIVE if reading.up else DOWN}\n"
    yield "phys_state", f"{LINK_UP if reading.up else DOWN_PHYS_STATES[port.link_layer]}\n"
    yield "rate", f"{rate} Gb/sec ({PORT_RATES[port.link_layer][rate]})\n"
    for name, value in reading.counters.items():
        yield f"counters/{name}", f"{value}\n"


class SysfsTree:
    """The sysfs of a scenario's node under `root`."""

    def __init__(self, root: Path, scenario: Scenario):
        self.root = root
        self.scenario = scenario
        self.node: NodeSpec = scenario.node
        self.functions = pci_functions(scenario)
        self.ports = [
            (port, [f for f in scenario.faults if f.kind in PORT_FAULTS and f.params.get("port") == port.name])
            for port in scenario.node.network
        ]
        # Only the functions an `aer` fault names, and their root ports, have counters that move.
        self._aer_moves = self.node.aer_counters and any(f.kind == "aer" for f in scenario.faults)
        self._root_ports: Set[str] = set(self.node.bridges.values())
        self._written: Dict[Path, str] = {}

    def build(self, now: float) -> Path:
        """Write the whole tree as it is at scenario time `now`; return its root."""
        for function in self.functions:
            self._write_function(function)
        for port, _ in self.ports:
            self._write_port(port)
        for path, text in self._changed(now):
            path.write_text(text)
        return self.root

    def update(self, now: float) -> int:
        """Bring each port's state, rate and counters, and the AER counters, to scenario time `now`; return
        how many files were rewritten. Cost: a few arithmetic operations a port and fault, and a file made and
        renamed for each changed one (the data counters of every port that carries traffic, at each new instant)."""
        changed = self._changed(now)
        for path, text in changed:
            self._replace(path, text)
        return len(changed)

    def _changed(self, now: float) -> List[Tuple[Path, str]]:
        """(path, text) of each time-varying file whose text at `now` is not the one last written, which
        it is taken to be from now on."""
        changed = []
        for path, text in self._moving_files(now):
            if self._written.get(path) != text:
                self._written[path] = text
                changed.append((path, text))
        return changed

    def _moving_files(self, now: float) -> Iterator[Tuple[Path, str]]:
        for port, faults in self.ports:
            directory = self._port_directory(port)
            for name, text in port_files(port, port_reading(port, faults, now)):
                yield directory / name, text
        if self._aer_moves:
            for address, counts in aer_counts(self.scenario, now).items():
                yield from self._aer_files(address, counts)

    def _aer_files(self, address: str, counts: pcie_aer.Counts) -> Iterator[Tuple[Path, str]]:
        """A function's AER files as they are with `counts`: a root port's are its received totals."""
        directory = self.function_directory(address)
        files = pcie_aer.root_port_files(counts) if address in self._root_ports else pcie_aer.device_files(counts)
        yield from ((directory / name, text) for name, text in files.items())

    def function_directory(self, address: str) -> Path:
        return self.root / self._located(address)

    def _located(self, address: str) -> str:
        """Where a PCI function's directory is: under its root port, or on the root bus of its domain."""
        bridge = self.node.bridge_of(address)
        return f"devices/pci{address[:4]}:00/" + (f"{bridge}/{address}" if bridge else address)

    def _port_directory(self, port: PortSpec) -> Path:
        return self.function_directory(port.pci) / "infiniband" / port.device / "ports" / str(port.port)

    def _write_function(self, function: PciSpec) -> None:
        directory = self.function_directory(function.address)
        directory.mkdir(parents=True)
        (directory / "vendor").write_text(f"0x{function.vendor:04x}\n")
        (directory / "device").write_text(f"0x{function.device_id:04x}\n")
        (directory / "class").write_text(f"0x{function.class_code:06x}\n")
        _link(self.root / "bus" / "pci" / "devices" / function.address, f"../../../{self._located(function.address)}")
        if function.driver is not None:
            drivers = self.root / "bus" / "pci" / "drivers" / function.driver
            drivers.mkdir(parents=True, exist_ok=True)
            _link(directory / "driver", os.path.relpath(drivers, directory))
        if self.node.aer_counters and function.kind in AER_KINDS:
            for name, text in self._zero_aer(function).items():
                (directory / name).write_text(text)

    def _zero_aer(self, function: PciSpec) -> Dict[str, str]:
        """The AER files of an AER-capable function that has seen no error: a root port's have its totals too."""
        files = pcie_aer.device_files({})
        return dict(files, **pcie_aer.root_port_files({})) if function.kind == "bridge" else files

    def _write_port(self, port: PortSpec) -> None:
        function = self.function_directory(port.pci)
        device = function / "infiniband" / port.device
        (self._port_directory(port) / "counters").mkdir(parents=True)
        (self._port_directory(port) / "link_layer").write_text(f"{port.link_layer}\n")
        if not (device / "device").is_symlink():
            _link(device / "device", f"../../../{port.pci}")
            self._class_link("infiniband", device)
        interface = function / "net" / port.netdev
        interface.mkdir(parents=True)
        (interface / "dev_port").write_text(f"{port.port - 1}\n")
        self._class_link("net", interface)

    def _class_link(self, kind: str, target: Path) -> None:
        """`class/<kind>/<name>`, a link to the device's directory under its PCI function's."""
        _link(self.root / "class" / kind / target.name, "../../" + target.relative_to(self.root).as_posix())

    def _replace(self, path: Path, text: str) -> None:
        # Written beside the tree, then renamed over the file: a reader finds the old text or the new.
        # One staging file serves: the simulated library calls update() under its lock.
        staging = self.root / ".staging"
        staging.write_text(text)
        os.replace(staging, path)


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)
