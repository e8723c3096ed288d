"""NVIDIA XID codes: what each means, where it comes from, and what an operator should do.

The codes are data (xid_catalog.yaml, NVIDIA's whole catalog); this module holds the closed sets
their fields take, which monitors and dashboards filter on, and checks the data against them once,
at import. `in_context` gives what a code asks for where NVIDIA's catalog makes that depend on the
other XIDs of the GPU and on the system (XID 45)."""

from dataclasses import dataclass, replace
from pathlib import Path
from typing import AbstractSet, Dict, List

import yaml

from gpu_monitoring.status import Status

CATALOG_PATH = Path(__file__).parent / "xid_catalog.yaml"

ORIGINS = ("application", "driver", "firmware", "memory", "nvlink", "bus", "power_thermal", "hardware")
# The device health each severity gives.
SEVERITIES: Dict[str, Status] = {"ok": Status.OK, "warning": Status.WARNING, "critical": Status.CRITICAL}
# One action per resolution NVIDIA's catalog gives; the `xid_action` tag and the monitors use these names.
ADVICE = {
    "none": "No action needed for this XID itself; act on any other XID or health reason that comes with it.",
    "investigate": (
        "Nothing to recover now. If it repeats, read the driver log (dmesg) around it and look at the application "
        "that ran then; send a bug report (nvidia-bug-report.sh) to NVIDIA support if the cause is not yours."
    ),
    "restart_app": (
        "Restart the application that ran on this GPU; if it repeats, check the application and its CUDA setup."
    ),
    "restart_vm": "Restart the virtual machine that owns this GPU; the GPU itself needs no reset.",
    "update_software": (
        "Bring the GPU driver (guest and host, for vGPU) and firmware to matching supported versions, "
        "then start the workload again."
    ),
    "check_mechanicals": (
        "At the next maintenance, check that the GPU is seated and its auxiliary power cables are connected; "
        "it runs at reduced clocks until then."
    ),
    "follow_recovery_action": (
        "Do what the driver's recovery action for this GPU says (its health reason, or `nvidia-smi -q`): "
        "nothing, drain peer-to-peer traffic, reset the GPU or reboot the node."
    ),
    "reset_gpu": (
        "Drain the GPU's workloads and reset the GPU (nvidia-smi -r) or reboot the node; if it repeats, plan an RMA."
    ),
    "reboot_node": (
        "Drain the node and reboot it; the GPU is unreachable until then. "
        "If it repeats, check power and seating, then RMA."
    ),
    "check_link": "Check the NVLink/NVSwitch fabric and reset the GPU; if it repeats, replace the link or baseboard.",
    "reset_if_uvm_or_vgpu": (
        "Reset the GPU (nvidia-smi -r, once its workloads are drained) if Unified Memory (UVM) or vGPU is in use "
        "on it; otherwise nothing needs doing."
    ),
    "restart_fabric_manager": (
        "Restart the NVIDIA Fabric Manager on this node (systemctl restart nvidia-fabricmanager) and read its log "
        "(/var/log/fabricmanager.log)."
    ),
    "contact_support": (
        "Collect a bug report (nvidia-bug-report.sh) and open a case with NVIDIA or the system's vendor."
    ),
}
# The actions that ask for a GPU reset, a reboot or a drain: their verdicts are held until the fix
# (held_verdicts), and each counts toward escalation.
HELD_ACTIONS = frozenset({"reset_gpu", "reboot_node", "check_link"})
_FIELDS = {"code", "meaning", "origin", "action", "severity"}
_OPTIONAL = {"note"}


@dataclass(frozen=True)
class Xid:
    code: int
    meaning: str
    origin: str  # one of ORIGINS, or "unknown"
    action: str  # one of ADVICE's keys
    severity: str  # one of SEVERITIES' keys
    note: str = ""  # what NVIDIA's catalog adds for this code to its action's advice

    @property
    def advice(self) -> str:
        return f"{ADVICE[self.action]} {self.note}" if self.note else ADVICE[self.action]

    @property
    def status(self) -> Status:
        return SEVERITIES[self.severity]


def load(path: Path = CATALOG_PATH) -> Dict[int, Xid]:
    """The catalog by code; a malformed entry, an unknown origin, action or severity, or a code
    listed twice fails here, at import, rather than when that XID happens."""
    catalog: Dict[int, Xid] = {}
    for entry in yaml.safe_load(path.read_text())["codes"]:
        problems = _problems(entry, catalog)
        if problems:
            raise ValueError(f"{path.name}: {entry}: " + "; ".join(problems))
        catalog[entry["code"]] = Xid(**entry)
    return catalog


def _problems(entry: dict, seen: Dict[int, Xid]) -> List[str]:
    if not _FIELDS <= set(entry) <= _FIELDS | _OPTIONAL:
        return [f"fields {sorted(entry)}, not {sorted(_FIELDS)} (and maybe {sorted(_OPTIONAL)})"]
    if not isinstance(entry["code"], int) or entry["code"] <= 0:
        return ["code is not a positive integer"]
    if entry["code"] in seen:
        return ["code listed twice"]
    problems = [f"{name} is empty" for name in ("meaning", "note")
                if name in entry and not (isinstance(entry[name], str) and entry[name])]
    for field, allowed in (("origin", ORIGINS), ("action", ADVICE), ("severity", SEVERITIES)):
        if entry[field] not in allowed:
            problems.append(f"{field} {entry[field]!r} is not one of {sorted(allowed)}")
    return problems


CATALOG: Dict[int, Xid] = load()


def describe(code: int) -> Xid:
    """The code's entry; a code the catalog lacks (a newer driver's) is still reported, as unknown."""
    return CATALOG.get(code) or Xid(code, "unknown", "unknown", "investigate", "ok")


# NVIDIA's catalog: XID 45, the cleanup after an aborted or faulted application, asks alone on an
# NVSwitch system for a Fabric Manager restart ("Solo: RESTART_FM"); with other XIDs it follows
# theirs ("Not Solo: IGNORE (follow other Xid)").
FABRIC_MANAGER_XID = 45


def in_context(code: int, codes: AbstractSet[int], on_nvswitch: bool) -> Xid:
    """The code's entry as it applies to one GPU in one run: `codes` is every XID code the GPU raised
    in that run, `on_nvswitch` whether it registers with an NVLink fabric (an NVSwitch system)."""
    info = describe(code)
    if code == FABRIC_MANAGER_XID and on_nvswitch and codes == {code}:
        return replace(info, action="restart_fabric_manager", severity="warning")
    return info


def label(code: int, count: int = 1) -> str:
    """`XID 13`, or `XID 13 × 3,000` for many of one code."""
    return f"XID {code}" if count == 1 else f"XID {code} × {count:,}"
