"""What the kernel's log tells of the node that no GPU's NVML does: NVSwitch SXids, ConnectX health and
module errors, PCIe AER errors on a NIC's link, and whether the log can be read at all.

- SXid: NVIDIA's NVSwitch documentation ("NVSwitch Errors") classes each SXid as fatal or non-fatal on
  its own line. A fatal one leaves the fabric through that switch unusable until the switch is reset,
  which on an NVSwitch system means a node reboot: CRITICAL, held until the node reboots. A non-fatal
  one is corrected or contained: a WARNING in the run that reads it.
- ConnectX (mlx5_core, drivers/net/ethernet/mellanox/mlx5/core/health.c): a firmware or health fatal
  error puts the NIC in its error state until the driver's health recovery or a reset brings it back:
  CRITICAL in the run that reads it, and its ports down after that say so themselves. A port module
  event (events.c: a cable error, overheating, an unplugged module) is a WARNING.
"""

from typing import Dict, List, Optional, Tuple

from gpu_monitoring.health.device_health import Health
from gpu_monitoring.health.pcie_aer import Counts, judge
from gpu_monitoring.node.driver_gpus import nvml_bus_id
from gpu_monitoring.snapshot import Event
from gpu_monitoring.status import Status

PortNames = Dict[str, List[str]]  # the ports of each NIC function, by its bus ID (NVML's form)


def kernel_record(health: Health, events: List[Event], nic_ports: PortNames, aer: Dict[str, Counts],
                  problem: Optional[str]) -> None:
    """The run's kernel events about the node, and the NICs' AER errors, into the node's health."""
    if problem:
        health.add(Status.WARNING, f"the kernel's log is not read: {problem}")
    _sxids(health, [e for e in events if e.kind == "sxid"])
    _nics(health, [e for e in events if e.kind == "nic"], nic_ports)
    for bus_id, names in nic_ports.items():
        judge(health, aer.get(bus_id), f"{', '.join(names)}'s NIC")


def _sxids(health: Health, events: List[Event]) -> None:
    groups: Dict[Tuple[str, int, str], List[Event]] = {}
    for event in events:
        groups.setdefault((_address(event), event.code, event.severity or "nonfatal"), []).append(event)
    for (switch, code, severity), group in groups.items():
        first = group[0]
        times = f" × {len(group):,}" if len(group) > 1 else ""
        link = f" on link {first.link}" if first.link is not None else ""
        what = f"NVSwitch {switch}: SXid {code}{times} ({'fatal' if severity == 'fatal' else 'non-fatal'}){link}"
        detail = f": {first.detail}" if first.detail else ""
        if severity == "fatal":
            health.add(Status.CRITICAL, f"{what}{detail}: NVLink traffic through this switch has stopped; drain "
                                        "the node and reboot it", hold=f"sxid:{switch}", since=first.timestamp)
        else:
            health.add(Status.WARNING, f"{what}{detail}")


def _nics(health: Health, events: List[Event], nic_ports: PortNames) -> None:
    by_function: Dict[Tuple[str, str], List[Event]] = {}
    for event in events:
        by_function.setdefault((_address(event), event.severity or "warning"), []).append(event)
    for (nic, severity), group in by_function.items():
        ports = ", ".join(nic_ports.get(nvml_bus_id(nic) or "", [])) or "no port of this node"
        said = "; ".join(dict.fromkeys(event.detail for event in group if event.detail))
        if severity == "fatal":
            # Not held: mlx5's health recovery (health.c, devlink's fw_fatal reporter) may reset the NIC by
            # itself; while it does not, its ports stay down and say so.
            health.add(Status.CRITICAL, f"ConnectX {nic} ({ports}) reported a fatal error ({said}): its ports stay "
                                        "down until the driver's health recovery or a reset brings it back")
        else:
            health.add(Status.WARNING, f"ConnectX {nic} ({ports}): {said}")


def _address(event: Event) -> str:
    """The function an event names, in the kernel's form (`0000:05:00.0`)."""
    bus_id = event.pci_bus_id or "?"
    parts = bus_id.lower().split(":")
    return ":".join([parts[0][-4:], *parts[1:]]) if len(parts) == 3 else bus_id
