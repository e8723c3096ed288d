"""NVIDIA XID codes: what each means, where it comes from, and what an operator should do."""

from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class Xid:
    code: int
    meaning: str
    origin: str  # application | driver | memory | firmware | hardware | nvlink | bus
    action: str  # none | restart_app | reset_gpu | reboot_node | check_link | investigate
    severity: str  # ok | warning | critical: the health it gives the device

    @property
    def advice(self) -> str:
        return ADVICE[self.action]


ADVICE = {
    "none": "No action needed; it gives context to the XID that follows or precedes it.",
    "restart_app": (
        "Restart the application that ran on this GPU; if it repeats, check the application and its CUDA setup."
    ),
    "reset_gpu": (
        "Drain the GPU's workloads and reset the GPU (nvidia-smi -r) or reboot the node; if it repeats, plan an RMA."
    ),
    "reboot_node": (
        "Drain the node and reboot it; the GPU is unreachable until then. "
        "If it repeats, check power and seating, then RMA."
    ),
    "check_link": "Check the NVLink/NVSwitch fabric and reset the GPU; if it repeats, replace the link or baseboard.",
    "investigate": "Check the driver logs (dmesg) around this time; watch whether the rate grows.",
}

_CATALOG = [
    Xid(13, "Graphics engine exception", "application", "restart_app", "warning"),
    Xid(31, "GPU memory page fault (MMU fault)", "application", "restart_app", "warning"),
    Xid(43, "GPU stopped processing", "application", "restart_app", "warning"),
    Xid(45, "Preemptive cleanup after a previous error", "driver", "restart_app", "warning"),
    Xid(48, "Double-bit ECC error", "memory", "reset_gpu", "critical"),
    Xid(62, "Internal micro-controller halt", "firmware", "reset_gpu", "critical"),
    Xid(63, "Row remapping event: a reset applies it", "memory", "reset_gpu", "ok"),
    Xid(64, "Row remapping failure", "memory", "reset_gpu", "critical"),
    Xid(68, "Video processor exception", "hardware", "restart_app", "warning"),
    Xid(69, "Graphics engine class error", "hardware", "restart_app", "warning"),
    Xid(74, "NVLink error", "nvlink", "check_link", "critical"),
    Xid(79, "GPU has fallen off the bus", "bus", "reboot_node", "critical"),
    Xid(92, "High single-bit ECC error rate", "memory", "investigate", "ok"),
    Xid(94, "Contained ECC error", "memory", "restart_app", "warning"),
    Xid(95, "Uncontained ECC error", "memory", "reset_gpu", "critical"),
    Xid(109, "Context switch timeout", "driver", "reset_gpu", "critical"),
    Xid(119, "GSP RPC timeout", "firmware", "reset_gpu", "critical"),
    Xid(120, "GSP error", "firmware", "reset_gpu", "critical"),
    Xid(140, "Unrecovered ECC error", "memory", "reset_gpu", "critical"),
    Xid(143, "GPU initialization failure", "firmware", "reset_gpu", "critical"),
    Xid(154, "GPU recovery action changed", "driver", "none", "ok"),
    Xid(156, "Resource retirement event", "memory", "reset_gpu", "critical"),
]
CATALOG: Dict[int, Xid] = {x.code: x for x in _CATALOG}


def describe(code: int) -> Xid:
    return CATALOG.get(code) or Xid(code, f"XID {code}", "unknown", "investigate", "ok")
