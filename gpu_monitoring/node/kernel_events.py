"""The kernel's log as events: what the patterns recognise in each new record, the process an XID names
identified where it still runs, handed out until a reader says they were delivered.

Only recognised messages become events; every other line is dropped where it is read (another
tenant's messages are never kept or sent). The sidecar journals these events beside NVML's; in local
mode the check submits them with its run and then moves the cursor on (`acknowledge`).
"""

import logging
import os
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Tuple

from gpu_monitoring.node.driver_gpus import nvml_bus_id
from gpu_monitoring.node.kernel_log import Cursor, KernelLog, KernelRecord
from gpu_monitoring.node.kernel_patterns import KernelFinding, KernelPatterns
from gpu_monitoring.node.procfs import ProcessOwner, process_owner, process_stat

log = logging.getLogger(__name__)

# Events kept for readers that keep failing to deliver them: a storm of XIDs, in bounded memory.
MAX_PENDING = 10000
# proc(5): a process's start time in /proc/<pid>/stat is in clock ticks since boot.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

Identity = Tuple[Optional[str], Optional[ProcessOwner]]  # its name, its owner


class KernelEvents:
    def __init__(self, log_: KernelLog, proc_root: Optional[str]) -> None:
        self.log = log_
        self.proc_root = proc_root
        self.patterns = KernelPatterns()
        self.committed: Cursor = log_.cursor  # where a restart goes on from
        self._pending: List[Dict[str, Any]] = []
        self._read_to: Cursor = log_.cursor
        self._uuids: Dict[str, str] = {}  # GPU UUIDs by PCI address, as the driver named them in this boot

    @property
    def problem(self) -> Optional[str]:
        return self.log.problem

    def read(self) -> List[Dict[str, Any]]:
        """Events not yet acknowledged, then those of the records written since: each a Snapshot Event's fields."""
        records = self.log.read()
        self._read_to = self.log.cursor
        processes: Dict[int, Identity] = {}
        for record in records:
            for finding in self.patterns.match(record.text, record.device):
                self._pending.append(self._event(record, finding, processes))
        self._bound()
        return list(self._pending)

    def acknowledge(self, delivered: Optional[int] = None) -> None:
        """The first `delivered` events handed out (all, by default) reached their reader; once none waits,
        the cursor moves past every record read."""
        del self._pending[: len(self._pending) if delivered is None else delivered]
        if not self._pending:
            self.committed = self._read_to

    def _event(self, record: KernelRecord, finding: KernelFinding, processes: Dict[int, Identity]) -> Dict[str, Any]:
        if finding.kind == "gpu_uuid" and finding.address and finding.uuid:
            self._uuids[finding.address] = finding.uuid
        event: Dict[str, Any] = {
            "device_uuid": finding.uuid or self._uuids.get(finding.address or ""),
            "pci_bus_id": nvml_bus_id(finding.address) if finding.address else None,
            "kind": finding.kind,
            "code": finding.code or 0,
            "timestamp": record.timestamp,
            "source": "kernel",
            "pid": finding.pid,
            "process_name": finding.process_name,
            "detail": finding.detail,
            "severity": finding.severity,
            "link": finding.link,
            "implied": finding.implied,
            "reporter": finding.reporter,
            "boot_id": self.log.boot_id,
            "kernel_seq": record.seq,
        }
        if finding.pid is not None:
            event.update(self._owner(finding.pid, finding.process_name, record.uptime, processes))
        return event

    def _owner(self, pid: int, named: Optional[str], uptime: float, processes: Dict[int, Identity]) -> Dict[str, Any]:
        """The owner of the process the driver named, where it is still the process that ran then; its
        name from /proc where the driver gave none (the name the driver gave is the one it had then)."""
        if pid not in processes:
            processes[pid] = self._identify(pid, uptime)
        name, owner = processes[pid]
        found: Dict[str, Any] = {"process_name": name} if name and not named else {}
        if owner is not None:
            found.update(container_id=owner.container_id, pod_uid=owner.pod_uid,
                         slurm=asdict(owner.slurm) if owner.slurm else None)
        return found

    def _identify(self, pid: int, uptime: float) -> Identity:
        if not self.proc_root:
            return None, None
        try:
            stat = process_stat(self.proc_root, pid)
            # A pid started after the line was written is another process, given the pid since.
            if stat is None or stat.start_time is None or stat.start_time / CLOCK_TICKS > uptime + 1:
                return None, None
            return stat.name, process_owner(self.proc_root, pid)
        except OSError as e:
            log.debug("process %d an XID named: %s", pid, e)
            return None, None

    def _bound(self) -> None:
        dropped = len(self._pending) - MAX_PENDING
        if dropped > 0:
            log.warning("%d events of the kernel's log were never delivered; dropping the oldest", dropped)
            del self._pending[:dropped]

    def close(self) -> None:
        self.log.close()
