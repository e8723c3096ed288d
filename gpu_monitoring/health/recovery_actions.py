"""The driver's recovery action (nvml.h's nvmlDeviceGpuRecoveryAction_t, read through the field
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): what each value asks of whoever runs the GPU.

Values and names from CUDA 13's nvml.h (NVML_GPU_RECOVERY_ACTION_*): 0-3 came with R565, 4 with
R570, 5 with R595, 6 and 7 with R615 (NVML's change log). The words are this check's own.
"""

from typing import Dict, NamedTuple, Optional


class Action(NamedTuple):
    name: str  # the `recovery_action` tag's value: nvml.h's name, lowercased
    severity: Optional[str]  # the health status it sets: None, "warning" or "critical"
    advice: str


NONE = 0
ACTIONS: Dict[int, Action] = {
    NONE: Action("none", None, "nothing to do"),
    1: Action("gpu_reset", "critical",
              "reset the GPU (nvidia-smi -r) once its workloads are stopped"),
    2: Action("node_reboot", "critical",
              "reboot the node: a GPU reset will not recover it"),
    3: Action("drain_p2p", "warning",
              "drain peer-to-peer (NVLink) traffic: stop new multi-GPU work on this GPU until it settles"),
    4: Action("drain_and_reset", "critical",
              "drain the GPU of its workloads (cordon the node), then reset it"),
    5: Action("recover_imex_domain", "critical",
              "recover the IMEX domain: restart the IMEX daemons of the NVLink domain"),
    6: Action("bus_reset", "critical",
              "reset the GPU's PCIe bus (a full GPU reset through its slot) once its workloads are stopped"),
    7: Action("system_reboot", "critical",
              "power-cycle the system: a node reboot will not recover it"),
}
UNKNOWN = "unknown"  # the tag of a value outside the enum


def describe(value: int) -> Action:
    """The action a value asks for; one outside nvml.h's enum is not trusted, and says so."""
    return ACTIONS.get(value) or Action(
        UNKNOWN, "warning", f"the driver asks for recovery action {value}, which this check does not know: "
                            "see nvidia-smi -q")
