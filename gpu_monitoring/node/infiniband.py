"""The InfiniBand and RoCE ports of a node's RDMA devices: `<sysfs_root>/class/infiniband/<device>/ports/<n>/`.

What a port directory holds (kernel Documentation/ABI/stable/sysfs-class-infiniband, written by
drivers/infiniband/core/sysfs.c):

    state        "4: ACTIVE"              the number, then DOWN, INIT, ARMED, ACTIVE or ACTIVE_DEFER
    phys_state   "5: LinkUp"              the number, then Sleep, Polling, Disabled, LinkUp...
    rate         "400 Gb/sec (4X NDR)"    active width times active speed; "10 Gb/sec (4X)" for SDR
    link_layer   "InfiniBand" or "Ethernet" (RoCE)
    counters/    the PortCounters the port's performance agent answers, one decimal number a file;
                 port_rcv_data and port_xmit_data count octets divided by 4. A port whose agent does
                 not answer one (RoCE ports, for some) fails the read with EINVAL (older kernels
                 wrote "N/A (no PMA)" instead).

The port's network interface is one of `<device>/device/net/*` (the RDMA device's PCI function's
interfaces): the one whose `dev_port` (kernel Documentation/ABI/testing/sysfs-class-net: which port
of a function with several an interface is, decimal) is the port's number less 1, as the drivers set it
(mlx4_en and IPoIB's parent interfaces: dev_port = port - 1).
"""

import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from gpu_monitoring.node.kernel_files import read_count, read_value
from gpu_monitoring.node.pci_links import PCI_ADDRESS, AerTurns, aer_paths, parent_port, read_aer
from gpu_monitoring.snapshot import NetworkPort

INFINIBAND_DIRECTORY = ("class", "infiniband")
COUNTERS = (
    "link_downed",
    "symbol_error",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "port_rcv_data",
    "port_xmit_data",
)
_NAMED = re.compile(r"[0-9]+: ([A-Za-z][A-Za-z_ ]*)")
_RATE = re.compile(r"([0-9]+(?:\.[0-9]+)?) Gb/sec\b.*")

PortKey = Tuple[str, int]


@dataclass(frozen=True)
class _Fixed:
    """What does not change while a port exists: its link layer and interface, and its files' paths."""

    link_layer: Optional[str]
    netdev: Optional[str]
    directory: str
    counters: Tuple[Tuple[str, str], ...]  # (counter, its file)
    pci_address: Optional[str]  # the NIC function the port is on
    parent: Optional[str]  # the PCI port above that function
    aer: Tuple[Tuple[str, str], ...]  # the function's AER counter files


class PortReader:
    """Reads the ports under one sysfs root, run after run.

    Cost of a read: a listing of `class/infiniband`, then 3 reads and up to 7 counter reads a port (a GPU
    node has 8 to 12 ports), and its NIC function's 3 AER counter reads one run in AER_EVERY. A device's
    ports, their link layer, network interface and PCI function are resolved only when the devices listed
    differ from the last read's (a device appeared, went, or its driver was reloaded): a listing of each
    device's `ports` and `device/net`, one read per interface and two resolved links.
    """

    def __init__(self, sysfs_root: str) -> None:
        self._directory = os.path.join(sysfs_root, *INFINIBAND_DIRECTORY)
        self._devices: Optional[List[str]] = None
        self._fixed: Dict[PortKey, _Fixed] = {}
        self._aer = AerTurns()

    def read(self) -> Optional[List[NetworkPort]]:
        """The ports, by device and port number; None where there is no `class/infiniband` to list
        (a node without RDMA devices, or without their drivers), an empty list where it holds none."""
        try:
            devices = sorted(os.listdir(self._directory))
        except OSError:
            return None
        if devices != self._devices:
            ports = self._list(devices)
            self._fixed = {key: self._resolve(key, ports) for key in ports}
            self._devices = devices
        self._aer.next_run()
        read = [self._read_port(key, fixed, self._aer.due(position))
                for position, (key, fixed) in enumerate(self._fixed.items())]
        return [port for port in read if port is not None]

    def _list(self, devices: List[str]) -> List[PortKey]:
        ports = []
        for device in devices:
            try:
                names = os.listdir(os.path.join(self._directory, device, "ports"))
            except OSError:
                continue  # the device went while it was listed
            ports.extend((device, number) for number in map(_integer, names) if number is not None)
        return sorted(ports)

    def _resolve(self, key: PortKey, ports: List[PortKey]) -> _Fixed:
        directory = os.path.join(self._directory, key[0], "ports", str(key[1]))
        single = sum(1 for device, _ in ports if device == key[0]) == 1
        function = os.path.join(self._directory, key[0], "device")
        address = os.path.basename(os.path.realpath(function))
        return _Fixed(
            link_layer=read_value(os.path.join(directory, "link_layer")),
            netdev=self._netdev(key, single),
            directory=directory,
            counters=tuple((name, os.path.join(directory, "counters", name)) for name in COUNTERS),
            pci_address=address if PCI_ADDRESS.fullmatch(address) else None,
            parent=parent_port(function),
            aer=aer_paths(function),
        )

    def _netdev(self, key: PortKey, single_port: bool) -> Optional[str]:
        directory = os.path.join(self._directory, key[0], "device", "net")
        try:
            # By name: where interfaces share a dev_port, every resolve takes the same one.
            names = sorted(os.listdir(directory))
        except OSError:
            return None
        dev_ports = {name: _integer(read_value(os.path.join(directory, name, "dev_port"))) for name in names}
        for name in names:
            if dev_ports[name] == key[1] - 1:
                return name
        # dev_port came with Linux 3.15; before it a device with one port and one interface is clear.
        if single_port and len(names) == 1 and dev_ports[names[0]] is None:
            return names[0]
        return None

    def _read_port(self, key: PortKey, fixed: _Fixed, aer_due: bool) -> Optional[NetworkPort]:
        directory = fixed.directory
        state = read_value(os.path.join(directory, "state"))
        if state is None and not os.path.isdir(directory):
            return None  # the device went after it was listed (unbound, reset): no port, not a port down
        counters = {}
        for name, path in fixed.counters:
            value = read_count(path)
            if value is not None:
                counters[name] = value
        return NetworkPort(
            device=key[0],
            port=key[1],
            state=_named(state),
            phys_state=_named(read_value(os.path.join(directory, "phys_state"))),
            rate_gbps=_rate(read_value(os.path.join(directory, "rate"))),
            link_layer=fixed.link_layer,
            netdev=fixed.netdev,
            counters=counters,
            pci_address=fixed.pci_address,
            parent=fixed.parent,
            aer=read_aer(fixed.aer) if fixed.pci_address and aer_due else None,
        )


def _named(text: Optional[str]) -> Optional[str]:
    match = _NAMED.fullmatch(text or "")
    return match.group(1) if match else None


def _rate(text: Optional[str]) -> Optional[float]:
    match = _RATE.fullmatch(text or "")
    return float(match.group(1)) if match else None


def _integer(text: Optional[str]) -> Optional[int]:
    return int(text) if text and text.isascii() and text.isdigit() else None
