"""A DCGM read's outcome as the sidecar's snapshot carries it to the check: the `dcgm.can_connect`
status and reason, written where the sidecar read the exporter and read back by the check."""

from gpu_monitoring.dcgm.reader import State
from gpu_monitoring.snapshot import DcgmRead
from gpu_monitoring.status import Status


def carried(state: State) -> DcgmRead:
    status, reason = state
    return DcgmRead(status.name.lower(), reason)


def state_of(read: DcgmRead) -> State:
    return Status[read.status.upper()], read.reason
