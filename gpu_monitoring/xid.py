"""NVIDIA XID codes: what each means, where it comes from, and what an operator should do.

The codes are data (xid_catalog.yaml, NVIDIA's whole catalog); this module holds the closed sets
their fields take, which monitors and dashboards filter on, and checks the data against them once,
at import."""

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

import yaml

from .service_checks import Status

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
    "contact_support": (
        "Not expected on this GPU: collect a bug report (nvidia-bug-report.sh) and open a case with NVIDIA "
        "or the system's vendor."
    ),
}
# The actions that ask for a GPU reset, a reboot or a drain: their verdicts are held until the fix
# (held_verdicts), and each counts toward escalation.
HELD_ACTIONS = frozenset({"reset_gpu", "reboot_node", "check_link"})
_FIELDS = {"code", "meaning", "origin", "action", "severity"}


@dataclass(frozen=True)
class Xid:
    code: int
    meaning: str
    origin: str  # one of ORIGINS, or "unknown"
    action: str  # one of ADVICE's keys
    severity: str  # one of SEVERITIES' keys

    @property
    def advice(self) -> str:
        return ADVICE[self.action]

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
    if set(entry) != _FIELDS:
        return [f"fields {sorted(entry)}, not {sorted(_FIELDS)}"]
    if not isinstance(entry["code"], int) or entry["code"] <= 0:
        return ["code is not a positive integer"]
    if entry["code"] in seen:
        return ["code listed twice"]
    problems = [] if isinstance(entry["meaning"], str) and entry["meaning"] else ["meaning is empty"]
    for field, allowed in (("origin", ORIGINS), ("action", ADVICE), ("severity", SEVERITIES)):
        if entry[field] not in allowed:
            problems.append(f"{field} {entry[field]!r} is not one of {sorted(allowed)}")
    return problems


CATALOG: Dict[int, Xid] = load()


def describe(code: int) -> Xid:
    """The code's entry; a code the catalog lacks (a newer driver's) is still reported, as unknown."""
    return CATALOG.get(code) or Xid(code, "unknown", "unknown", "investigate", "ok")
