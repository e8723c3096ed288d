"""A simulated node's kernel log: `<node directory>/kmsg`, a file of /dev/kmsg's records that grows as
scenario time passes (what each record says: simulator.kernel_messages).

The format is /dev/kmsg's (kernel Documentation/ABI/testing/dev-kmsg): a record a line,
`prio,seq,usec,flags;message`, where prio is the syslog facility times 8 plus the level, seq numbers the
records of the boot from 0 without gaps, usec is the time since boot in microseconds and flags `-` says
the record is whole; then, for a record a driver printed through dev_printk, its dictionary as
continuation lines that begin with a space: ` SUBSYSTEM=pci`, ` DEVICE=+pci:0000:01:00.0`.

The node booted BOOT_UPTIME seconds before scenario time 0: a record of something at scenario time t has
usec (BOOT_UPTIME + t) x 10^6. Records follow from the scenario alone, so a node rebuilt at a later start
(a restarted sidecar's) writes the same records with the same seqs; like the kernel, it keeps those of
faults before its start.

The ring keeps the newest records whose bytes (each record's line and continuation lines here) fit
`node.kernel_ring_bytes`; the older ones are overwritten and their seqs gone, as a reader of /dev/kmsg
behind them learns from EPIPE, and a reader of this file from the jump in seq. New records are appended
with one write, so that a reader finds whole records; when the ring drops some, the records it keeps are
written to a file beside it that is renamed over `kmsg`, so a reader holding the old one open sees the
inode change.
"""

import os
from collections import deque
from pathlib import Path
from typing import Deque, List

from gpu_monitoring.simulator.kernel_messages import PRINTED, KernelMessage, Printer
from gpu_monitoring.simulator.scenario import Scenario

# Seconds the node had been up at scenario time 0: half a day, so that its GPU processes, which the proc
# root starts some eleven hours after boot (proc_root's default start time), ran before any fault of the
# timeline, as the kernel's line of an XID and the process it names must.
BOOT_UPTIME = 12 * 3600


def usec_at(seconds_since_boot: float) -> int:
    return int(round(seconds_since_boot * 1e6))


def encode(seq: int, usec: int, message: KernelMessage) -> bytes:
    """A record as /dev/kmsg hands it out, with its dev_printk dictionary where it has one."""
    record = f"{message.facility * 8 + message.level},{seq},{usec},-;{message.text}\n"
    if message.device is not None:
        record += f" SUBSYSTEM=pci\n DEVICE=+pci:{message.device}\n"
    return record.encode()


class KernelLog:
    """The log of a scenario's node at `path`: `start(now)` writes every record up to scenario time `now`,
    `advance(now)` adds those of the faults that fired since."""

    def __init__(self, path: Path, scenario: Scenario):
        self.path = path
        self.ring_bytes = scenario.node.kernel_ring_bytes
        self.next_seq = 0
        self.oldest_seq = 0  # of the records the ring keeps
        self._printer = Printer(scenario)
        self._faults = [fault for fault in scenario.faults if fault.kind in PRINTED]
        self._next_fault = 0
        self._kept: Deque[bytes] = deque()
        self._kept_bytes = 0

    def start(self, now: float) -> Path:
        """Write the boot's records and those of every fault fired by `now`; return the file's path."""
        records = [self._record(usec_at(at), message) for at, message in self._printer.boot()]
        self._keep(records + self._due(now))
        self._rewrite()
        return self.path

    def advance(self, now: float) -> int:
        """Add the records of the faults fired by `now`; return how many. Cost where none fired: a comparison."""
        if not self._is_due(now):
            return 0
        records = self._due(now)
        if self._keep(records):
            self._rewrite()
        else:
            self._append(b"".join(records))
        return len(records)

    def _is_due(self, now: float) -> bool:
        return self._next_fault < len(self._faults) and self._faults[self._next_fault].at <= now

    def _due(self, now: float) -> List[bytes]:
        records = []
        while self._is_due(now):
            fault = self._faults[self._next_fault]
            usec = usec_at(BOOT_UPTIME + fault.at)
            records += [self._record(usec, message) for message in self._printer.fault(fault)]
            self._next_fault += 1
        return records

    def _record(self, usec: int, message: KernelMessage) -> bytes:
        record = encode(self.next_seq, usec, message)
        self.next_seq += 1
        return record

    def _keep(self, records: List[bytes]) -> int:
        """Put the records in the ring, dropping the oldest past its size; return how many were dropped."""
        for record in records:
            self._kept.append(record)
            self._kept_bytes += len(record)
        dropped = 0
        while self._kept_bytes > self.ring_bytes:
            self._kept_bytes -= len(self._kept.popleft())
            dropped += 1
        self.oldest_seq += dropped
        return dropped

    def _append(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            view = memoryview(data)
            while view:  # a regular file takes it all in one write; a short write goes on where it stopped
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    def _rewrite(self) -> None:
        staging = self.path.with_name(f".{self.path.name}.new")
        staging.write_bytes(b"".join(self._kept))
        os.replace(staging, self.path)
