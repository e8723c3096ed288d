"""The kernel's ring as a process reads it: /dev/kmsg, a file of its records (a simulated node's), or
syslog(2) where a container may not open the device.

/dev/kmsg (kernel Documentation/ABI/testing/dev-kmsg): each read() hands out one record,
`prio,seq,usec,flags[,...];message\\n`, then continuation lines ` KEY=value\\n` (`SUBSYSTEM=pci`,
`DEVICE=+pci:0000:02:00.0`). `seq` numbers the records of a boot without gaps and `usec` is the time
since boot. A reader opens at the oldest record the ring still holds; one whose next record was
overwritten before it read it gets EPIPE once and goes on at the oldest kept, so a jump in `seq` is
records lost. Opened with O_NONBLOCK, EAGAIN says nothing newer is there. A read needs a buffer as
large as the record (CONSOLE_EXT_LOG_MAX, 8 KiB) or fails with EINVAL. Where kernel.dmesg_restrict
is 1 reading needs CAP_SYSLOG (Documentation/admin-guide/sysctl/kernel.rst, "dmesg_restrict").
Records user space writes to /dev/kmsg have facility LOG_USER unless they say otherwise; only the
kernel's own (facility 0) are read here.
"""

import os
import re
from typing import Iterator, List

from gpu_monitoring.node.kernel_records import (
    KERNEL_FACILITY,
    MAX_RECORD_BYTES,
    MAX_RECORDS_PER_READ,
    MAX_TEXT_BYTES_PER_READ,
    Cursor,
    KernelRecord,
    Source,
    Unreadable,
    Why,
    parse_record,
)


class KmsgDevice(Source):
    """The character device: one record a read, kept open so a run reads only what is new."""

    def __init__(self, path: str, why: Why) -> None:
        self.path = path
        self.overwritten = 0  # EPIPEs met
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            raise Unreadable(why(path, e)) from None
        self._why = why

    def read(self, cursor: Cursor, boot_time: float) -> List[KernelRecord]:
        records = []
        while len(records) < MAX_RECORDS_PER_READ:
            try:
                data = os.read(self.fd, MAX_RECORD_BYTES)
            except BlockingIOError:
                break
            except BrokenPipeError:
                self.overwritten += 1  # the seq that follows tells how many
                continue
            except OSError as e:
                raise Unreadable(self._why(self.path, e)) from None
            if not data:
                break
            record = parse_record(data, boot_time)
            if record is not None:
                records.append(record)
        return records

    def close(self) -> None:
        os.close(self.fd)


class KmsgFile(Source):
    """A regular file of /dev/kmsg's records, one a line with its continuation lines, appended to as the
    ring grows and replaced (another inode) when it wraps: a simulated node's."""

    def __init__(self, path: str, why: Why) -> None:
        self.path = path
        self._why = why
        self._file = None
        self._offset = 0

    def read(self, cursor: Cursor, boot_time: float) -> List[KernelRecord]:
        try:
            self._reopen_if_replaced()
            self._file.seek(self._offset)
            data = self._file.read(MAX_TEXT_BYTES_PER_READ)
        except OSError as e:
            raise Unreadable(self._why(self.path, e)) from None
        whole = data[: data.rfind(b"\n") + 1]  # a record still being written waits for the next read
        self._offset += len(whole)
        records = (parse_record(chunk, boot_time) for chunk in _kmsg_chunks(whole))
        return [record for record in records if record is not None]

    def _reopen_if_replaced(self) -> None:
        now = os.stat(self.path)
        if self._file is not None and (now.st_ino != self.inode or now.st_size < self._offset):
            self.close()
        if self._file is None:
            self._file = open(self.path, "rb")
            self.inode, self._offset = os.fstat(self._file.fileno()).st_ino, 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None


class SyslogCall(Source):
    """The ring through syslog(2) SYSLOG_ACTION_READ_ALL (man 2 syslog), which leaves it as it is: a line a
    record, `<prio>[seconds.microseconds] message` (printk's time). It numbers no record, so a line is
    numbered by its time since boot, in microseconds, times SAME_MICROSECOND plus its place among the lines
    of the same microsecond. Each read copies the whole ring; only the lines after the cursor are parsed."""

    kind = "syslog"
    gapless = False
    SIZE_BUFFER, READ_ALL = 10, 3  # SYSLOG_ACTION_SIZE_BUFFER, SYSLOG_ACTION_READ_ALL
    SAME_MICROSECOND = 64

    def __init__(self) -> None:
        import ctypes

        self._klogctl = ctypes.CDLL(None, use_errno=True).klogctl
        self._ctypes = ctypes
        size = self._call(self.SIZE_BUFFER, None, 0)
        self._buffer = ctypes.create_string_buffer(max(size, MAX_RECORD_BYTES))
        self._call(self.READ_ALL, self._buffer, 1)  # refused here, not at the first read, where not permitted

    def _call(self, action: int, buffer, size: int) -> int:
        answered = self._klogctl(action, buffer, size)
        if answered < 0:
            number = self._ctypes.get_errno()
            raise OSError(number, os.strerror(number))
        return answered

    def read(self, cursor: Cursor, boot_time: float) -> List[KernelRecord]:
        try:
            size = self._call(self.READ_ALL, self._buffer, len(self._buffer))
        except OSError as e:
            raise Unreadable(f"syslog(2) cannot read the kernel's ring: {e.strerror}") from None
        data = self._buffer.raw[:size]
        return list(_syslog_records(_tail(data, cursor.seq // self.SAME_MICROSECOND), boot_time))

    def close(self) -> None:
        """Nothing is held between reads."""


_RING_LINE = re.compile(rb"<(\d+)>\[ *(\d+)\.(\d{6})\] ?(.*)")


def _tail(data: bytes, after_us: int) -> bytes:
    """The lines from the last one at or before `after_us` on: the ring's lines are in time order."""
    end = len(data)
    while end > 0:
        start = data.rfind(b"\n", 0, end - 1) + 1
        match = _RING_LINE.match(data, start)
        if match is not None and int(match.group(2)) * 1_000_000 + int(match.group(3)) < after_us:
            return data[start:]
        end = start
    return data


def _syslog_records(data: bytes, boot_time: float) -> Iterator[KernelRecord]:
    previous, same = -1, 0
    for line in data.split(b"\n"):
        match = _RING_LINE.fullmatch(line)
        if match is None or int(match.group(1)) >> 3 != KERNEL_FACILITY:
            continue
        microseconds = int(match.group(2)) * 1_000_000 + int(match.group(3))
        same = same + 1 if microseconds == previous else 0
        previous = microseconds
        if same < SyslogCall.SAME_MICROSECOND:
            yield KernelRecord(microseconds * SyslogCall.SAME_MICROSECOND + same, boot_time + microseconds / 1e6,
                               microseconds / 1e6, match.group(4).decode("utf-8", "replace"))


def _kmsg_chunks(data: bytes) -> Iterator[bytes]:
    """A buffer of records, each with its continuation lines (which start with a space)."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        while end + 1 < len(data) and data[end + 1:end + 2] == b" ":
            end = data.find(b"\n", end + 1)
        yield data[start:end + 1]
        start = end + 1
