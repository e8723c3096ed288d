"""Scenario files: a YAML description of one simulated GPU node.

A scenario names device models (static facts of a GPU product), the devices built from
them (with their load, processes and MIG layout) and a timeline of faults. Device
entries override their model's keys, so one model serves eight identical GPUs. A driver may
lack functions (`missing_functions`, symbols absent as from an old driver) and refuse field IDs
(`refused_fields`, pynvml's NVML_FI_* names, answered NOT_SUPPORTED on every device).

`dcgm_exporter` runs NVIDIA's dcgm-exporter on the node, as the GPU Operator deploys it
(simulator.dcgm_exporter_server):

    dcgm_exporter:
      counters: default        # dcgm-exporter's default-counters.csv; `profiling` adds SM active,
                               # SM occupancy, the FP64/FP32/FP16 pipes and NVLink bytes
      interval: 30             # seconds between DCGM's samples (dcgm-exporter's -c, 30000 ms by default)
      hostname_label: Hostname # or `hostname`, as dcgm-exporter names it since May 2026

`node` describes what the kernel shows around the GPUs (simulator.sysfs_root writes it as sysfs). Every
GPU NVML lists is on the PCI bus, bound to `nvidia`, with its model's `pci_device_id` and `pci_class`
(0x030200, a 3D controller, unless the model says 0x030000, VGA). Besides them:

    node:
      expected_gpus: 4                      # the GPUs its operator knows it has: stands in for expected_gpus
      pci:                                  # functions NVML does not list
        - {address: "0000:c1:00.0", kind: gpu, driver: none}   # on the bus, no driver bound
        - {address: "0000:51:00.0", kind: gpu, driver: vfio-pci}  # given to a VM
        - {address: "0000:05:00.0", kind: nvswitch, device_id: 0x22a3}  # driver nvidia by default
        - {address: "0000:41:00.1", kind: audio, device_id: 0x22ba}     # driver snd_hda_intel by default
      network:                              # RDMA ports, each on a Mellanox/NVIDIA NIC function
        - {device: mlx5_0, pci: "0000:15:00.0"}
        - {device: mlx5_8, pci: "0000:29:00.1", link_layer: Ethernet, rate: 100, netdev: enp41s0f1np1}

A GPU entry's `device_id` is by default the node's GPUs' (its PCI device ID, as `lspci -n` shows it);
`class` replaces the kind's class code (0x030000 for a VGA GPU); `driver: none` (or null) leaves a
function unbound. A port's keys and their defaults: `port` 1,
`link_layer` InfiniBand (or Ethernet: RoCE), `rate` 400 (Gb/s, one of PORT_RATES' for its link
layer), `netdev` as systemd's predictable naming calls the NIC function's interface (ibp21s0,
enp41s0f1np1), `pci_device_id` 0x1021 (ConnectX-7), `traffic_gbps` the data each direction carries
(a quarter of the rate), `counters` the PortCounters the port held at t=0 (link_downed, symbol_error...).

Port faults name their port `device/port`: `{at: 35, kind: port_flap, port: mlx5_1/1}`; any of them may
add to the error counters when it begins: `counters: {symbol_error: 40}`.
"""

import re
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import pynvml
import yaml

SCENARIO_DIR = Path(__file__).parent / "scenarios"
# Scenarios are a few KiB; a path to anything far larger is a mistake, not a node to read into memory.
MAX_SCENARIO_BYTES = 16 * 1024 * 1024
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")

FAULT_KINDS = {
    "xid",  # an XID event (`count` of them: a storm); `lost_for` also makes the GPU fall off the bus
    "gpu_lost",  # every call on the device answers GPU_IS_LOST for `duration`
    "ecc_sbe",  # `count` corrected errors, with an SBE event
    "ecc_dbe",  # `count` uncorrected errors, with a DBE event
    "thermal_slowdown",  # hardware and software thermal slowdown for `duration`
    "power_brake",  # hardware power-brake slowdown for `duration`
    "remap_pending",  # an uncorrectable row remap waiting for a reset
    "remap_failure",  # a row remap that could not be done
    "retired_pending",  # a page waiting for retirement after a double-bit error
    "nvlink_down",  # NVLink `link` inactive for `duration`
    "pcie_degraded",  # PCIe link trained at `generation`/`width` for `duration`
    "driver_reload",  # every call answers UNINITIALIZED until nvmlInit runs again
    "gpu_unavailable",  # an nvmlEventTypeGpuUnavailableError event, on drivers from R565
    "recovery_action",  # the driver asks for `action` (gpu_reset, node_reboot, ...) for `duration`, with XID 154
    "fabric_lost",  # NVLink fabric registration back to `state` (not_started), or failed with `status`
    "c2c_replay",  # `count` (1) replays on C2C `link` (0)
    "port_down",  # RDMA `port` down for `duration` (None: to the end); link_downed counts it as it goes
    "port_flap",  # `port` down and up again within `duration` (FLAP_SECONDS): link_downed and
    # link_error_recovery count it, while a read before and one after both find the port up
    "port_slow",  # `port` retrained at `rate` Gb/s for `duration` (None: to the end); not a link down
}
PORT_FAULTS = ("port_down", "port_flap", "port_slow")
FLAP_SECONDS = 2.0

NVIDIA_VENDOR = 0x10DE
# A model without its `pci_device_id`: an H100 SXM's (pci.ids: 10de:2330 GH100[H100 SXM5 80GB]).
DEFAULT_PCI_DEVICE_ID = 0x233010DE
MELLANOX_VENDOR = 0x15B3
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


EXPORTER_COUNTERS = ("default", "profiling")
HOSTNAME_LABELS = ("Hostname", "hostname")


class ScenarioError(ValueError):
    """The scenario file is missing or does not describe a node."""


@dataclass
class Fault:
    at: float
    kind: str
    device: Optional[int] = None
    duration: Optional[float] = None
    params: Dict[str, Any] = field(default_factory=dict)

    def active(self, now: float) -> bool:
        if now < self.at:
            return False
        return self.duration is None or now < self.at + self.duration


@dataclass
class MigSpec:
    profile: str
    gpu_instance_id: int
    compute_instance_id: int
    memory_mib: int
    utilization: float
    uuid: str
    processes: List[Dict[str, Any]]
    # The GPU instance profile's ID (nvidia-smi mig -lgip's ID) and the instance's placement (start, size in
    # memory slices): NVIDIA's DRA driver names a MIG device by them. A scenario gives them where it needs them.
    profile_id: Optional[int] = None
    placement: Optional[Tuple[int, int]] = None


@dataclass
class DeviceSpec:
    index: int
    uuid: str
    pci_bus_id: str
    facts: Dict[str, Any]
    load: Dict[str, Any]
    processes: List[Dict[str, Any]]
    mig: List[MigSpec]
    unsupported: List[str]

    def __getitem__(self, key: str) -> Any:
        return self.facts[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.facts.get(key, default)

    @property
    def pci_device_id(self) -> int:
        """NVML's pciDeviceId: the PCI device ID in the upper 16 bits, the vendor's in the lower."""
        return int(self.facts.get("pci_device_id", DEFAULT_PCI_DEVICE_ID))

    @property
    def pci_address(self) -> str:
        """NVML's "%08X:%02X:%02X.0" bus ID as the kernel writes a PCI address, "%04x:%02x:%02x.%x"
        (the NVIDIA driver's nv-procfs.c, and sysfs' bus/pci/devices names)."""
        domain, bus, rest = self.pci_bus_id.split(":")
        slot, function = rest.split(".")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(slot, 16):02x}.{int(function, 16):x}"


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


@dataclass(frozen=True)
class DcgmExporterSpec:
    counters: str = "default"
    interval: float = 30.0
    hostname_label: str = "Hostname"

    @property
    def profiling(self) -> bool:
        return self.counters == "profiling"


@dataclass
class Scenario:
    name: str
    description: str
    driver: Dict[str, Any]
    missing_functions: List[str]
    devices: List[DeviceSpec]
    faults: List[Fault]
    extra: Dict[str, Any] = field(default_factory=dict)
    # Field IDs the driver answers NOT_SUPPORTED for, on every device (`refused_fields`: pynvml names).
    refused_fields: Set[int] = field(default_factory=set)
    dcgm_exporter: Optional[DcgmExporterSpec] = None
    node: NodeSpec = field(default_factory=NodeSpec)


def available() -> List[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def resolve(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        candidate = path
    else:
        candidate = SCENARIO_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        raise ScenarioError(
            f"no scenario {name_or_path!r}: not a file, and not one of {', '.join(available())}"
        )
    return candidate


def load(name_or_path: str) -> Scenario:
    path = resolve(name_or_path)
    raw = _read(path)
    if not isinstance(raw, dict):
        raise ScenarioError(f"scenario {path}: must be a mapping of driver, models, devices and faults; "
                            f"got a {type(raw).__name__}")
    if not isinstance(raw.get("devices"), list):
        raise ScenarioError(f"scenario {path}: `devices` must be a list; got {raw.get('devices')!r}")
    try:
        return _build(path.stem, raw)
    except (AttributeError, KeyError, TypeError, ValueError) as e:  # a part of the wrong shape
        raise ScenarioError(f"scenario {path}: {e!r}") from e


def _read(path: Path) -> Any:
    """The file's YAML; anything unreadable (binary, huge, not permitted) is a ScenarioError."""
    try:
        if path.stat().st_size > MAX_SCENARIO_BYTES:
            raise ScenarioError(f"scenario {path}: larger than {MAX_SCENARIO_BYTES} bytes")
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ScenarioError(f"scenario {path}: cannot be read as YAML: {e}") from e


def _build(name: str, raw: Dict[str, Any]) -> Scenario:
    models = raw.get("models", {})
    devices = [_device(name, i, entry, models) for i, entry in enumerate(raw["devices"])]
    faults = sorted((_fault(entry) for entry in raw.get("faults", [])), key=lambda f: f.at)
    known = {"description", "driver", "missing_functions", "refused_fields", "models", "devices", "faults",
             "dcgm_exporter", "node"}
    node = _node(raw.get("node") or {}, devices)
    _check_port_faults(faults, node.network)
    return Scenario(
        name=name,
        description=raw.get("description", ""),
        driver=raw["driver"],
        missing_functions=list(raw.get("missing_functions", [])),
        devices=devices,
        faults=faults,
        extra={k: v for k, v in raw.items() if k not in known},
        refused_fields={_field_id(n) for n in raw.get("refused_fields", [])},
        dcgm_exporter=_dcgm_exporter(raw["dcgm_exporter"]) if "dcgm_exporter" in raw else None,
        node=node,
    )


def _node(raw: Dict[str, Any], devices: List[DeviceSpec]) -> NodeSpec:
    gpu_device_id = devices[0].pci_device_id >> 16 if devices else None
    pci = [_pci(entry, gpu_device_id) for entry in raw.get("pci", [])]
    entries = raw.get("network", [])
    slots = Counter(_address(e["pci"]).rpartition(".")[0] for e in entries)
    network = [_port(entry, slots) for entry in entries]
    addresses = [d.pci_address for d in devices] + [f.address for f in pci]
    addresses += list(dict.fromkeys(port.pci for port in network))
    repeated = sorted(a for a, n in Counter(addresses).items() if n > 1)
    if repeated:
        raise ValueError(f"node: more than one PCI function at {', '.join(repeated)}")
    for what in ("name", "netdev"):
        seen = Counter(getattr(port, what) for port in network)
        if any(n > 1 for n in seen.values()):
            raise ValueError(f"node.network: a port's {what} given twice among {sorted(seen)}")
    expected = raw.get("expected_gpus")
    return NodeSpec(pci, network, None if expected is None else int(expected))


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
    return PciSpec(
        address=_address(entry["address"]),
        kind=kind,
        device_id=int(device_id),
        class_code=int(entry.get("class", class_code)),
        driver=None if driver in (None, "none") else str(driver),
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
        counters=_counters(entry.get("counters", {}), f"node.network {entry!r}"),
    )


def _counters(raw: Dict[str, Any], where: str) -> Dict[str, int]:
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


def _check_port_faults(faults: List[Fault], ports: List[PortSpec]) -> None:
    by_name = {port.name: port for port in ports}
    for fault in faults:
        if fault.kind not in PORT_FAULTS:
            continue
        port = by_name.get(fault.params.get("port"))
        if port is None:
            raise ValueError(f"fault {fault.kind} at {fault.at}: port is one of node.network's {sorted(by_name)}; "
                             f"got {fault.params.get('port')!r}")
        _counters(fault.params.get("counters", {}), f"fault {fault.kind} at {fault.at}")
        if fault.kind == "port_slow" and fault.params.get("rate") not in PORT_RATES[port.link_layer]:
            raise ValueError(f"fault port_slow at {fault.at}: rate is one of {sorted(PORT_RATES[port.link_layer])} "
                             f"Gb/s for {port.name}; got {fault.params.get('rate')!r}")


def _dcgm_exporter(entry: Dict[str, Any]) -> DcgmExporterSpec:
    spec = DcgmExporterSpec(**entry)
    if spec.counters not in EXPORTER_COUNTERS or spec.hostname_label not in HOSTNAME_LABELS:
        raise ValueError(f"dcgm_exporter: counters is one of {EXPORTER_COUNTERS}, hostname_label one of "
                         f"{HOSTNAME_LABELS}; got {entry!r}")
    if not float(spec.interval) > 0:
        raise ValueError(f"dcgm_exporter: interval must be a positive number of seconds; got {spec.interval!r}")
    return replace(spec, interval=float(spec.interval))


def _field_id(name: str) -> int:
    value = getattr(pynvml, name, None) if str(name).startswith("NVML_FI_") else None
    if not isinstance(value, int):
        raise ValueError(f"refused_fields: {name!r} is not a pynvml NVML_FI_* field ID")
    return value


# nvidia-smi mig -lgip on an 8-slice GPU (A100, H100): the GPU instance profile's ID by (compute slices,
# memory slices), whatever the memory per slice: 1g.10gb 19, 1g.20gb 15, 2g.20gb 14, 3g.40gb 9, 4g.40gb 5,
# 7g.80gb 0 on an 80 GB GPU.
_GI_PROFILE_IDS = {(1, 1): 19, (1, 2): 15, (2, 2): 14, (3, 4): 9, (4, 4): 5, (7, 8): 0}
# Where nvidia-smi mig -lgi places each instance of an 8-slice GPU, by GPU instance ID: 1g instances
# 7-13 at slices 0-6, 2g 3-5 at 0, 2, 4, 3g 1-2 at 0 and 4, 4g and 7g at 0.
_FIRST_ID = {1: 7, 2: 3, 3: 1, 4: 0, 7: 0}
_MEMORY_SLICES = 8


def _slices(entry: Dict[str, Any], gpu_memory_mib: Optional[int]) -> Optional[Tuple[int, int]]:
    """(compute slices, memory slices) of a MIG instance: `3g` of its profile name, and its memory in
    eighths of the GPU's (an instance has a little less than its slices: the rest is reserved)."""
    compute = entry["profile"].partition("g.")[0]
    if not compute.isdigit() or not gpu_memory_mib:
        return None
    return int(compute), max(1, round(entry["memory_mib"] * _MEMORY_SLICES / gpu_memory_mib))


def _placement(entry: Dict[str, Any], slices: Optional[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
    if "placement" in entry:
        return int(entry["placement"]["start"]), int(entry["placement"]["size"])
    if slices is None or slices[0] not in _FIRST_ID:
        return None
    compute, memory = slices
    return (entry["gi"] - _FIRST_ID[compute]) * memory if compute < 4 else 0, memory


def _mig(scenario: str, index: int, m: Dict[str, Any], slices: Optional[Tuple[int, int]]) -> MigSpec:
    return MigSpec(
        profile=m["profile"],
        gpu_instance_id=m["gi"],
        compute_instance_id=m.get("ci", 0),
        memory_mib=m["memory_mib"],
        utilization=float(m.get("utilization", 0)),
        uuid=m.get("uuid") or _stable_uuid("MIG", scenario, index, m["gi"], m.get("ci", 0)),
        processes=list(m.get("processes", [])),
        profile_id=m.get("profile_id", _GI_PROFILE_IDS.get(slices)),
        placement=_placement(m, slices),
    )


def _device(scenario: str, index: int, entry: Dict[str, Any], models: Dict[str, Any]) -> DeviceSpec:
    facts = dict(models[entry["model"]]) if "model" in entry else {}
    facts.update({k: v for k, v in entry.items() if k not in ("load", "processes", "mig", "unsupported")})
    gpu_uuid = entry.get("uuid") or _stable_uuid("GPU", scenario, index)
    mig = [_mig(scenario, index, m, _slices(m, facts.get("memory_mib"))) for m in entry.get("mig", [])]
    return DeviceSpec(
        index=index,
        uuid=gpu_uuid,
        pci_bus_id=entry.get("pci_bus_id") or f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        facts=facts,
        load=dict(facts.pop("load_defaults", {}), **entry.get("load", {})),
        processes=list(entry.get("processes", [])),
        mig=mig,
        unsupported=list(facts.pop("unsupported", [])) + list(entry.get("unsupported", [])),
    )


def _fault(entry: Dict[str, Any]) -> Fault:
    kind = entry["kind"]
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}")
    params = {k: v for k, v in entry.items() if k not in ("at", "kind", "device", "duration")}
    return Fault(
        at=float(entry["at"]),
        kind=kind,
        device=entry.get("device"),
        duration=entry.get("duration", FLAP_SECONDS if kind == "port_flap" else None),
        params=params,
    )


def _stable_uuid(prefix: str, *parts: Any) -> str:
    return f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_URL, '/'.join(map(str, parts)))}"
