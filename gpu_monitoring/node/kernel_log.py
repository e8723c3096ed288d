"""The kernel's log, read from where the last read stopped: which way it is read (the `kernel_log`
option: the ring, node.kernel_ring, or a text log the host keeps, node.text_log), the cursor moved on
past the records read (node.kernel_records), records the ring overwrote before they were read counted,
and a log that cannot be read said once, with its fix.
"""

import errno
import logging
import os
import re
import stat
import time
from dataclasses import replace
from typing import List, Optional

from gpu_monitoring.node.kernel_records import (
    MAX_RECORD_BYTES,
    Cursor,
    KernelRecord,
    Source,
    Unreadable,
    parse_record,
)
from gpu_monitoring.node.kernel_ring import KmsgDevice, KmsgFile, SyslogCall
from gpu_monitoring.node.text_log import TextLog

log = logging.getLogger(__name__)

KMSG = "/dev/kmsg"
AUTO, NONE = "auto", "none"

__all__ = ["AUTO", "KMSG", "NONE", "Cursor", "KernelLog", "KernelRecord", "parse_record"]


class KernelLog:
    """Reads a node's kernel log run after run. `setting` is the `kernel_log` option (`auto`, `none` or a
    path), `option` how its owner names it in messages (the check's option, the sidecar's flag)."""

    def __init__(self, setting: str, proc_root: Optional[str], boot_id: Optional[str], cursor: Optional[Cursor] = None,
                 option: str = "kernel_log") -> None:
        self.setting = setting
        self.option = option
        self.boot_id = boot_id
        self.boot_time = _boot_time(proc_root)
        self.cursor = cursor if cursor is not None and cursor.boot_id == boot_id else Cursor(boot_id)
        self.lost = 0  # records overwritten before they were read, since this log was opened
        self.problem: Optional[str] = None
        self._source: Optional[Source] = None
        self._lost_told = 0

    @property
    def enabled(self) -> bool:
        return self.setting != NONE

    def read(self) -> List[KernelRecord]:
        """The records written since the cursor; none, with `problem` saying why, where the log cannot be read."""
        if not self.enabled:
            return []
        try:
            if self._source is None:
                self._source = self._open()
            records = self._source.read(self.cursor, self.boot_time)
        except Unreadable as e:
            self._close()
            self._say(str(e))
            return []
        self._say(None)
        return self._new(records)

    def _open(self) -> "Source":
        if self.setting == AUTO:
            return self._ring()
        try:
            mode = os.stat(self.setting).st_mode
        except OSError as e:
            raise Unreadable(self._why(self.setting, e)) from None
        if stat.S_ISCHR(mode):
            return KmsgDevice(self.setting, self._why)
        if _is_kmsg_file(self.setting):
            return KmsgFile(self.setting, self._why)
        return TextLog(self.setting, self._why)

    def _ring(self) -> "Source":
        """/dev/kmsg; where it cannot be opened, the same ring through syslog(2). A container runtime lets an
        unprivileged container open only its default devices (runc's device rules: null, zero, random, tty...),
        whatever is mounted, while syslog(2) asks only for CAP_SYSLOG."""
        try:
            return KmsgDevice(KMSG, self._why)
        except Unreadable as refused:
            try:
                ring = SyslogCall()
            except OSError as e:
                raise Unreadable(f"{refused}; nor can syslog(2) read the ring: {e.strerror or e}") from None
            log.info("%s; the same ring is read through syslog(2) instead", refused)
            return ring

    def _new(self, records: List[KernelRecord]) -> List[KernelRecord]:
        """The records after the cursor, moving it on; a jump in the kernel's seq counts records lost."""
        new = records
        if self.cursor.kind != self._source.kind:
            # Read another way than before (a runtime that now lets /dev/kmsg be opened): what was read is
            # told by the time alone.
            after = self.cursor.time if self.cursor.seq >= 0 and self.cursor.time is not None else float("-inf")
            new = [record for record in records if record.timestamp > after]
            self.cursor = Cursor(self.boot_id, -1, time=self.cursor.time, kind=self._source.kind)
        if self._source.numbered:
            records, new, last = new, [], self.cursor.seq
            for record in records:
                if record.seq > last:
                    self.lost += record.seq - last - 1 if self._source.gapless else 0
                    last = record.seq
                    new.append(record)
        if new:
            self.cursor = replace(self.cursor, seq=new[-1].seq, time=new[-1].timestamp, inode=self._source.inode)
        if not self._source.numbered:  # past the lines that were not the kernel's too
            self.cursor = replace(self.cursor, seq=self._source.end, inode=self._source.inode)
        self.cursor = replace(self.cursor, kind=self._source.kind)
        self._tell_lost()
        return new

    def _tell_lost(self) -> None:
        if self.lost > self._lost_told:
            log.info("the kernel's ring overwrote %d records before they were read (%d in all since this log was "
                     "opened): an XID among them is counted from NVML's event alone", self.lost - self._lost_told,
                     self.lost)
            self._lost_told = self.lost

    def _why(self, path: str, error: OSError) -> str:
        off = f"set {self.option} to none to stop reading it"
        if error.errno in (errno.EPERM, errno.EACCES):
            return (f"cannot read the kernel's log {path}: {error.strerror} (where kernel.dmesg_restrict is 1, the "
                    f"default on Ubuntu 22.04+ and RHEL, reading it needs the SYSLOG capability: add CAP_SYSLOG; "
                    f"or {off})")
        if error.errno == errno.ENOENT and path == KMSG:
            return (f"no {KMSG} here: in a container, mount the host's {KMSG} read-only at {KMSG} and add "
                    f"CAP_SYSLOG, or {off}")
        return f"cannot read the kernel's log {path}: {error.strerror or error} ({off})"

    def _say(self, problem: Optional[str]) -> None:
        """Each change of whether the log can be read is logged once."""
        if problem != self.problem:
            if problem is not None:
                log.warning("%s", problem)
            else:
                log.info("the kernel's log is read again" if self.problem else "reading the kernel's log")
        self.problem = problem

    def _close(self) -> None:
        if self._source is not None:
            self._source.close()
        self._source = None

    def close(self) -> None:
        self._close()


def _is_kmsg_file(path: str) -> bool:
    """Whether a regular file holds /dev/kmsg records (its first line `prio,seq,usec,flags;`)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(MAX_RECORD_BYTES)
    except OSError:
        return False
    return re.match(rb"\d+,\d+,\d+,[^;]*;", first) is not None


def _boot_time(proc_root: Optional[str]) -> float:
    """When the node booted, from `btime` in /proc/stat (proc(5): boot time, in seconds since the epoch);
    else from the clock since boot."""
    try:
        with open(os.path.join(proc_root or "/proc", "stat"), "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(int(line.split()[1]))
    except (OSError, ValueError, IndexError):
        pass
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)

