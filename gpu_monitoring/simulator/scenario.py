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

`node` describes what the kernel shows around the GPUs: simulator.node_spec.
"""

import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import pynvml
import yaml

from gpu_monitoring.simulator.node_spec import (
    FLAP_SECONDS,
    PORT_FAULTS,
    PORT_RATES,
    NodeSpec,
    PortSpec,
    checked_counters,
    node_spec,
)

SCENARIO_DIR = Path(__file__).parent / "scenarios"
# Scenarios are a few KiB; a path to anything far larger is a mistake, not a node to read into memory.
MAX_SCENARIO_BYTES = 16 * 1024 * 1024

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
    "aer",  # `count` PCIe errors of `severity` (AER_SEVERITIES) on GPU `device`: the kernel's log and its
    # sysfs AER counters tell, NVML does not
    "nic_fault",  # mlx5's health on `port`'s NIC: `severity` fatal (its firmware stopped answering, the
    # driver unloads and the port is down from then on) or warning (a cable module's error)
    "sxid",  # NVSwitch `switch` (a node.pci nvswitch's address) reports SXid `code` on `link`, `fatal` or not
}
# The kernel's AER severities, as an aer fault names them.
AER_SEVERITIES = ("corrected", "nonfatal", "fatal")
NIC_SEVERITIES = ("fatal", "warning")
# A model without its `pci_device_id`: an H100 SXM's (pci.ids: 10de:2330 GH100[H100 SXM5 80GB]).
DEFAULT_PCI_DEVICE_ID = 0x233010DE

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
    node = node_spec(raw.get("node") or {}, [d.pci_address for d in devices],
                     devices[0].pci_device_id >> 16 if devices else None)
    _check_port_faults(faults, node.network)
    for fault in faults:
        _check_kernel_fault(fault, devices, node)
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


def _check_port_faults(faults: List[Fault], ports: List[PortSpec]) -> None:
    """Each port fault names a port of the node, with counters and a rate its link layer has."""
    by_name = {port.name: port for port in ports}
    for fault in faults:
        if fault.kind not in PORT_FAULTS:
            continue
        port = by_name.get(fault.params.get("port"))
        if port is None:
            raise ValueError(f"fault {fault.kind} at {fault.at}: port is one of node.network's {sorted(by_name)}; "
                             f"got {fault.params.get('port')!r}")
        checked_counters(fault.params.get("counters", {}), f"fault {fault.kind} at {fault.at}")
        if fault.kind == "port_slow" and fault.params.get("rate") not in PORT_RATES[port.link_layer]:
            raise ValueError(f"fault port_slow at {fault.at}: rate is one of {sorted(PORT_RATES[port.link_layer])} "
                             f"Gb/s for {port.name}; got {fault.params.get('rate')!r}")


def _check_kernel_fault(fault: Fault, devices: List[DeviceSpec], node: NodeSpec) -> None:
    """What a fault the kernel's log tells of needs: a GPU behind a root port, a known severity, an NVSwitch
    of the node; ValueError naming the fault otherwise."""
    where, params = f"fault {fault.kind} at {fault.at}", fault.params
    on_gpu = isinstance(fault.device, int) and 0 <= fault.device < len(devices)
    if fault.kind in ("xid", "recovery_action", "aer") and not on_gpu:
        raise ValueError(f"{where}: device is the index of one of the {len(devices)} GPUs; got {fault.device!r}")
    if fault.kind == "xid" and params.get("kernel", "xid") not in ("xid", "fall_off"):
        raise ValueError(f"{where}: kernel is fall_off (the driver's message for a GPU off the bus), or left out")
    if fault.kind == "aer":
        if node.bridge_of(devices[fault.device].pci_address) is None:
            raise ValueError(f"{where}: GPU {fault.device} is on a root bus, behind no root port to report it")
        if params.get("severity") not in AER_SEVERITIES or int(params.get("count", 1)) < 1:
            raise ValueError(f"{where}: severity is one of {', '.join(AER_SEVERITIES)} and count at least 1")
    if fault.kind == "nic_fault" and params.get("severity") not in NIC_SEVERITIES:
        raise ValueError(f"{where}: severity is one of {', '.join(NIC_SEVERITIES)}; got {params.get('severity')!r}")
    if fault.kind == "sxid":
        switches = [f.address for f in node.pci if f.kind == "nvswitch"]
        numbers = all(isinstance(params.get(key, 0), int) for key in ("code", "link")) and "code" in params
        if str(params.get("switch")).lower() not in switches or not numbers:
            raise ValueError(f"{where}: switch is one of node.pci's NVSwitches {switches}, code and link numbers; "
                             f"got {params!r}")


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
