"""A scenario's `node` block: what the kernel shows around the GPUs (simulator.sysfs_root writes it as
sysfs). Every GPU NVML lists is on the PCI bus, bound to `nvidia`, with its model's `pci_device_id` and `pci_class`
(0x030200, a 3D controller, unless the model says 0x030000, VGA). Besides them:

    node:
      expected_gpus: 4                      # the GPUs its operator knows it has: stands in for expected_gpus
      pci:                                  # functions NVML does not list
        - {address: "0000:c1:00.0", kind: gpu, driver: none}   # on the bus, no driver bound
        - {address: "0000:e1:00.0", kind: gpu, init_failure: "0x26:0x56:1474"}  # bound; RmInitAdapter failed
        - {address: "0000:51:00.0", kind: gpu, driver: vfio-pci}  # given to a VM
        - {address: "0000:05:00.0", kind: nvswitch, device_id: 0x22a3}  # driver nvidia by default
        - {address: "0000:41:00.1", kind: audio, device_id: 0x22ba}     # driver snd_hda_intel by default
      network:                              # RDMA ports, each on a Mellanox/NVIDIA NIC function
        - {device: mlx5_0, pci: "0000:15:00.0"}
        - {device: mlx5_8, pci: "0000:29:00.1", link_layer: Ethernet, rate: 100, netdev: enp41s0f1np1}
      kernel_ring_bytes: 1048576            # the kernel's log ring (log_buf_len=1M): simulator.kernel_log
      aer_counters: true                    # false: a kernel older than 4.19, without the sysfs AER counters

A GPU entry's `device_id` is by default the node's GPUs' (its PCI device ID, as `lspci -n` shows it);
`class` replaces the kind's class code (0x030000 for a VGA GPU); `driver: none` (or null) leaves a
function unbound. A port's keys and their defaults: `port` 1,
`link_layer` InfiniBand (or Ethernet: RoCE), `rate` 400 (Gb/s, one of PORT_RATES' for its link
layer), `netdev` as systemd's predictable naming calls the NIC function's interface (ibp21s0,
enp41s0f1np1), `pci_device_id` 0x1021 (ConnectX-7), `traffic_gbps` the data each direction carries
(a quarter of the rate), `counters` the PortCounters the port held at t=0 (link_downed, symbol_error...).

Port faults name their port `device/port`: `{at: 35, kind: port_flap, port: mlx5_1/1}`; any of them may
add to the error counters when it begins: `counters: {symbol_error: 40}`.

A GPU or NIC function sits behind a PCIe root port, as on a real node: one bridge for each bus that holds
one, on the root bus of its domain (`bridges`: `0000:18` -> `0000:00:01.0`, the first such bus's).
"""

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
# The faults that name an RDMA port: a NIC's health fault takes its port's function down with it.
PORT_FAULTS = ("port_down", "port_flap", "port_slow", "nic_fault")
FLAP_SECONDS = 2.0

NVIDIA_VENDOR = 0x10DE
MELLANOX_VENDOR = 0x15B3
INTEL_VENDOR = 0x8086
# The root port a GPU or NIC sits behind: pci.ids 8086:352a "PCI Express Gen5 Port A" (a Sapphire Rapids
# Xeon's), a PCI-to-PCI bridge (class 06/04/00) that the kernel's PCIe port driver, pcieport, binds.
ROOT_PORT_DEVICE = 0x352A
BRIDGE_CLASS = 0x060400
BRIDGE_DRIVER = "pcieport"
# A kernel booted with log_buf_len=1M keeps this many bytes of records (kernel/printk/printk.c).
DEFAULT_RING_BYTES = 1024 * 1024
# The status of RmInitAdapter's failure as the driver prints it: "(0x26:0x56:1474)".
_INIT_FAILURE = re.compile(r"0x[0-9a-f]+:0x[0-9a-f]+:\d+")
# pci.ids: 15b3:1021 MT2910 Family [ConnectX-7].
CONNECTX_7 = 0x1021
# Each kind of NVIDIA PCI function a scenario may add: its class code (base class, subclass and
# programming interface, as the PCI SIG's code assignment numbers them) and the driver that binds
# it unless the entry says otherwise. An NVSwitch is an "other bridge"; a GPU with display outputs
# has an HD Audio function beside it.
PCI_KINDS = {
    "gpu": (0x030200, "nvidia"),
    "nvswitch": (0x068000, "nvidia"),
    "audio": (0x040300, "snd_hda_intel"),
}
# An RDMA NIC's function: an InfiniBand or an Ethernet controller, bound to mlx5_core.
NIC_CLASSES = {"InfiniBand": 0x020700, "Ethernet": 0x020000}
NIC_DRIVER = "mlx5_core"
# A port's rate in Gb/s as the kernel reports it: width and IB speed (drivers/infiniband/core/sysfs.c
# rate_show). InfiniBand ports train 4 lanes; an Ethernet port's are what mlx5 derives from the
# link's Ethernet protocol (drivers/infiniband/hw/mlx5/main.c translate_eth_*_proto_oper).
PORT_RATES = {
    "InfiniBand": {10: "4X SDR", 20: "4X DDR", 40: "4X QDR", 56: "4X FDR", 100: "4X EDR", 200: "4X HDR",
                   400: "4X NDR", 800: "4X XDR"},
    "Ethernet": {10: "1X QDR", 25: "1X EDR", 40: "4X QDR", 50: "2X EDR", 100: "4X EDR", 200: "4X HDR",
                 400: "4X NDR"},
}
DEFAULT_TRAFFIC_SHARE = 0.25
# The counters a port shows, with their widths in bits: the InfiniBand specification's PortCounters
# fields (drivers/infiniband/core/sysfs.c PORT_PMA_ATTR), the data counters PortCountersExtended's.
PORT_COUNTER_BITS = {
    "link_downed": 8,
    "symbol_error": 16,
    "link_error_recovery": 8,
    "port_rcv_errors": 16,
    "port_xmit_discards": 16,
    "port_rcv_data": 64,
    "port_xmit_data": 64,
}


@dataclass(frozen=True)
class PciSpec:
    """A PCI function: one of `node.pci`, or one the sysfs derives from a GPU or an RDMA port (kind `nic`).
    `driver` None: none bound."""

    address: str
    kind: str
    device_id: int
    class_code: int
    driver: Optional[str]
    vendor: int = NVIDIA_VENDOR
    # A GPU the driver bound but could not set up: RmInitAdapter's status, "0x26:0x56:1474".
    init_failure: Optional[str] = None


@dataclass
class PortSpec:
    """One RDMA port: port `port` of RDMA device `device`, on NIC function `pci`."""

    device: str
    port: int
    pci: str
    link_layer: str
    rate: int
    netdev: str
    pci_device_id: int
    traffic_gbps: float
    counters: Dict[str, int]

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"


@dataclass
class NodeSpec:
    pci: List[PciSpec] = field(default_factory=list)
    network: List[PortSpec] = field(default_factory=list)
    # How many GPUs its operator knows the node has: stands in for the check's `expected_gpus`.
    expected_gpus: Optional[int] = None
    # The root port of each bus that holds a GPU or NIC function: "0000:18" -> "0000:00:01.0".
    bridges: Dict[str, str] = field(default_factory=dict)
    kernel_ring_bytes: int = DEFAULT_RING_BYTES
    aer_counters: bool = True

    def bridge_of(self, address: str) -> Optional[str]:
        """The root port a function sits behind; None for one on a root bus."""
        return self.bridges.get(address.rpartition(":")[0])


def node_spec(raw: Dict[str, Any], gpu_addresses: List[str], gpu_device_id: Optional[int]) -> NodeSpec:
    """The `node` block of a scenario whose GPUs NVML lists sit at `gpu_addresses` (the kernel's form) with
    the PCI device ID `gpu_device_id`; ValueError for a block that does not describe a node."""
    pci = [_pci(entry, gpu_device_id) for entry in raw.get("pci", [])]
    entries = raw.get("network", [])
    slots = Counter(_address(e["pci"]).rpartition(".")[0] for e in entries)
    network = [_port(entry, slots) for entry in entries]
    addresses = list(gpu_addresses) + [f.address for f in pci]
    addresses += list(dict.fromkeys(port.pci for port in network))
    repeated = sorted(a for a, n in Counter(addresses).items() if n > 1)
    if repeated:
        raise ValueError(f"node: more than one PCI function at {', '.join(repeated)}")
    for what in ("name", "netdev"):
        seen = Counter(getattr(port, what) for port in network)
        if any(n > 1 for n in seen.values()):
            raise ValueError(f"node.network: a port's {what} given twice among {sorted(seen)}")
    expected = raw.get("expected_gpus")
    behind = list(gpu_addresses) + [f.address for f in pci if f.kind == "gpu"] + [port.pci for port in network]
    return NodeSpec(pci, network, None if expected is None else int(expected), _bridges(behind, addresses),
                    _ring_bytes(raw.get("kernel_ring_bytes", DEFAULT_RING_BYTES)), bool(raw.get("aer_counters", True)))


def _bridges(behind: List[str], functions: List[str]) -> Dict[str, str]:
    """A root port for each bus of `behind` (a root bus excepted), numbered in bus order on its domain's root
    bus as a Xeon's are (device 1 function 0, then 1.1 ...); ValueError where one would be at a function's
    address."""
    bridges: Dict[str, str] = {}
    for domain in sorted({address[:4] for address in behind}):
        buses = sorted({a.rpartition(":")[0] for a in behind if a.startswith(domain) and a[5:7] != "00"})
        if len(buses) > 31 * 8:
            raise ValueError(f"node: more buses with GPUs or NICs than root ports on domain {domain}'s root bus")
        bridges.update((bus, f"{domain}:00:{1 + k // 8:02x}.{k % 8}") for k, bus in enumerate(buses))
    taken = sorted(set(bridges.values()) & set(functions))
    if taken:
        raise ValueError(f"node: a PCI function at {', '.join(taken)}, where the root port of a bus with GPUs or "
                         f"NICs goes: move it off bus 00")
    return bridges


def _ring_bytes(value: Any) -> int:
    """The ring's size: at least what one record of CONSOLE_EXT_LOG_MAX (8 KiB) needs."""
    ring = int(value)
    if ring < 8192:
        raise ValueError(f"node.kernel_ring_bytes: at least 8192 (one record's most); got {value!r}")
    return ring


def _address(text: str) -> str:
    address = str(text).lower()
    if not _PCI_ADDRESS.fullmatch(address):
        raise ValueError(f"node: {text!r} is not a PCI address as the kernel writes one (0000:18:00.0)")
    return address


def _pci(entry: Dict[str, Any], gpu_device_id: Optional[int]) -> PciSpec:
    kind = entry.get("kind")
    if kind not in PCI_KINDS:
        raise ValueError(f"node.pci: kind is one of {', '.join(PCI_KINDS)}; got {entry!r}")
    class_code, driver = PCI_KINDS[kind]
    device_id = entry.get("device_id", gpu_device_id if kind == "gpu" else None)
    if device_id is None:
        raise ValueError(f"node.pci: {entry!r} needs its device_id")
    driver = entry.get("driver", driver)
    driver = None if driver in (None, "none") else str(driver)
    init_failure = entry.get("init_failure")
    bound_gpu = (kind, driver) == ("gpu", "nvidia")
    if init_failure is not None and not (bound_gpu and _INIT_FAILURE.fullmatch(str(init_failure))):
        raise ValueError(f"node.pci: init_failure is a GPU's, bound to nvidia, as RmInitAdapter's status "
                         f"\"0x26:0x56:1474\"; got {entry!r}")
    return PciSpec(
        address=_address(entry["address"]),
        kind=kind,
        device_id=int(device_id),
        class_code=int(entry.get("class", class_code)),
        driver=driver,
        init_failure=None if init_failure is None else str(init_failure),
    )


def _port(entry: Dict[str, Any], slots: Counter) -> PortSpec:
    link_layer = entry.get("link_layer", "InfiniBand")
    rate = entry.get("rate", 400)
    if rate not in PORT_RATES.get(link_layer, {}):
        raise ValueError(f"node.network: link_layer is InfiniBand or Ethernet, and rate one of its "
                         f"{PORT_RATES.get(link_layer, PORT_RATES['InfiniBand'])} Gb/s; got {entry!r}")
    address = _address(entry["pci"])
    return PortSpec(
        device=str(entry["device"]),
        port=int(entry.get("port", 1)),
        pci=address,
        link_layer=link_layer,
        rate=int(rate),
        netdev=str(entry.get("netdev") or _netdev(address, link_layer, slots[address.rpartition(".")[0]] > 1)),
        pci_device_id=int(entry.get("pci_device_id", CONNECTX_7)),
        traffic_gbps=float(entry.get("traffic_gbps", rate * DEFAULT_TRAFFIC_SHARE)),
        counters=checked_counters(entry.get("counters", {}), f"node.network {entry!r}"),
    )


def checked_counters(raw: Dict[str, Any], where: str) -> Dict[str, int]:
    """A `counters:` mapping of PortCounters names to what they add; ValueError naming `where` for others."""
    unknown = set(raw) - set(PORT_COUNTER_BITS)
    if unknown:
        raise ValueError(f"{where}: counters are among {', '.join(PORT_COUNTER_BITS)}; got {sorted(unknown)}")
    return {name: int(value) for name, value in raw.items()}


def _netdev(address: str, link_layer: str, multifunction: bool) -> str:
    """The interface's name by systemd's predictable naming (systemd.net-naming-scheme): `ib` or `en`,
    then p<bus>s<slot>, f<function> where the slot has several, and for mlx5's Ethernet uplinks the
    physical port's name, n + "p<port>" (the function's port on a NIC with one function a port)."""
    _, bus, rest = address.split(":")
    slot, function = (int(part, 16) for part in rest.split("."))
    name = f"p{int(bus, 16)}s{slot}" + (f"f{function}" if multifunction else "")
    return f"ib{name}" if link_layer == "InfiniBand" else f"en{name}np{function}"
