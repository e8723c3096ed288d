"""The NVML events a scenario's faults raise: which event type, with what event data, how many.

`events_of(fault)` answers for one fault; the simulated library queues them on every event set
registered for that type on the fault's GPU."""

from typing import List, Tuple

import pynvml

from .scenario import Fault

# The driver tells of a new recovery action with XID 154 (NVIDIA's XID catalog).
RECOVERY_ACTION_XID = 154
# Each fault kind that raises an event: its NVML event type.
EVENT_TYPES = {
    "xid": pynvml.nvmlEventTypeXidCriticalError,
    "recovery_action": pynvml.nvmlEventTypeXidCriticalError,
    "ecc_sbe": pynvml.nvmlEventTypeSingleBitEccError,
    "ecc_dbe": pynvml.nvmlEventTypeDoubleBitEccError,
}


def events_of(fault: Fault) -> List[Tuple[int, int]]:
    """(event type, event data) for each event the fault raises: an XID fault with `count` raises that
    many (a storm from one bad job); none for a fault kind without events."""
    event_type = EVENT_TYPES.get(fault.kind)
    if event_type is None:
        return []
    if fault.kind == "recovery_action":
        return [(event_type, RECOVERY_ACTION_XID)]
    if fault.kind == "xid":
        return [(event_type, fault.params.get("xid", 0))] * int(fault.params.get("count", 1))
    return [(event_type, 0)]
