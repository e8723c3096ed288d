"""The NVML events a scenario's faults raise: which event type, with what event data, how many.

`events_of(fault, driver)` answers for one fault on a driver of that major version; the simulated
library queues them on every event set registered for that type on the fault's GPU."""

from typing import List, Optional, Tuple

import pynvml

from gpu_monitoring.simulator.scenario import Fault

# The driver tells of a new recovery action with XID 154 (NVIDIA's XID catalog).
RECOVERY_ACTION_XID = 154
# Each fault kind that raises an event: its NVML event type.
EVENT_TYPES = {
    "xid": pynvml.nvmlEventTypeXidCriticalError,
    "recovery_action": pynvml.nvmlEventTypeXidCriticalError,
    "ecc_sbe": pynvml.nvmlEventTypeSingleBitEccError,
    "ecc_dbe": pynvml.nvmlEventTypeDoubleBitEccError,
    "gpu_unavailable": pynvml.nvmlEventTypeGpuUnavailableError,
}
# Event types an older driver lacks, by the first driver that has them: both came with R565, the
# recovery action event with the recovery action field (NVML's change log, v560 to v565).
SINCE_DRIVER = {
    pynvml.nvmlEventTypeGpuRecoveryAction: 565,
    pynvml.nvmlEventTypeGpuUnavailableError: 565,
}


def event_types(driver: int) -> int:
    """The mask of the event types above that a driver of this major version has."""
    return sum(event_type for event_type, since in SINCE_DRIVER.items() if driver >= since)


def events_of(fault: Fault, driver: Optional[int] = None) -> List[Tuple[int, int]]:
    """(event type, event data) for each event the fault raises on a driver of major version `driver`
    (None: one that has every type): an XID fault with `count` raises that many (a storm from one bad
    job); a recovery action, XID 154 and, where the driver has the type, a recovery-action event whose
    data is the action's value; none for a fault kind without events or a type the driver lacks."""
    event_type = EVENT_TYPES.get(fault.kind)
    if event_type is None or not _has(event_type, driver):
        return []
    if fault.kind == "recovery_action":
        return [(event_type, RECOVERY_ACTION_XID)] + _recovery_action_event(fault, driver)
    if fault.kind == "xid":
        return [(event_type, fault.params.get("xid", 0))] * int(fault.params.get("count", 1))
    return [(event_type, 0)]


def _recovery_action_event(fault: Fault, driver: Optional[int]) -> List[Tuple[int, int]]:
    if not _has(pynvml.nvmlEventTypeGpuRecoveryAction, driver):
        return []
    action = getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{fault.params['action'].upper()}")
    return [(pynvml.nvmlEventTypeGpuRecoveryAction, action)]


def _has(event_type: int, driver: Optional[int]) -> bool:
    return driver is None or driver >= SINCE_DRIVER.get(event_type, 0)
