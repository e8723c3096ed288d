"""The kernel's log, read from where the last read stopped: `/dev/kmsg`, a file of its records, or a
text log the host keeps.

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

Text logs, one message a line, its continuation lines indented (skipped): kern.log or syslog, in the
traditional form (`Nov 28 00:12:53 host kernel: [ 7140.123456] msg`, local time, no year) or RFC 3339
(`2026-11-28T00:12:53.123456+00:00 host kernel: msg`); `journalctl -k -o short-iso`
(`2026-11-28T00:12:53+0000 host kernel: msg`); `dmesg -T` (`[Sat Nov 28 00:12:53 2026] msg`). A line's
time is the line's own; lines from before this boot (`btime` in /proc/stat) are history, not news.

The cursor is the boot ID with the last record's `seq` (a text log: the offset after the last line
read, with the file's inode and that line's time). A cursor of another boot starts at the first
record of this one; without a cursor every record of this boot still in the ring is read, once.
"""

import errno
import json
import logging
import os
import re
import stat
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterator, List, Optional, Tuple

log = logging.getLogger(__name__)

KMSG = "/dev/kmsg"
AUTO, NONE = "auto", "none"
MAX_RECORD_BYTES = 8192  # CONSOLE_EXT_LOG_MAX
# A read takes at most this many records (a full 1 MiB ring holds about 10,000) or text bytes; the
# rest wait for the next read.
MAX_RECORDS_PER_READ = 50_000
MAX_TEXT_BYTES_PER_READ = 8 * 1024 * 1024
# A text log seen for the first time is read from no further back than this: what lies before is
# from earlier boots on any node that keeps its logs for days.
FIRST_TEXT_BYTES = 16 * 1024 * 1024
KERNEL_FACILITY = 0

_ISO_LINE = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)) \S+ kernel: ?(.*)")
_SYSLOG_LINE = re.compile(r"([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) \S+ kernel: ?(.*)")
_DMESG_LINE = re.compile(r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\] ?(.*)")
_UPTIME_PREFIX = re.compile(r"\[ *\d+\.\d+\] ?")


@dataclass(frozen=True)
class KernelRecord:
    seq: int
    timestamp: float  # seconds since the epoch
    uptime: float  # seconds since boot
    text: str  # the message, without its prefix
    device: Optional[str] = None  # the record's DEVICE= (`+pci:0000:02:00.0`), where it has one


@dataclass(frozen=True)
class Cursor:
    boot_id: Optional[str]
    # /dev/kmsg: the last record read; syslog(2): the last line's, numbered by its time (_SyslogCall); a text
    # log: the offset after the last line read.
    seq: int = -1
    inode: Optional[int] = None  # a text log: the file the offset is in
    time: Optional[float] = None  # the last record's time
    kind: str = "kmsg"  # how the records were read, which says what `seq` counts: kmsg, syslog or text

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, text: Optional[str]) -> Optional["Cursor"]:
        """A stored cursor; None where there is none or it cannot be read (then every record is news)."""
        try:
            raw = json.loads(text) if text else None
            if not isinstance(raw, dict) or type(raw.get("seq")) is not int:
                return None
            boot_id, inode, when, kind = raw.get("boot_id"), raw.get("inode"), raw.get("time"), raw.get("kind")
            return cls(boot_id if isinstance(boot_id, str) else None, raw["seq"],
                       inode if type(inode) is int else None,
                       float(when) if type(when) in (int, float) else None,
                       kind if kind in KINDS else "kmsg")
        except ValueError:
            return None


KINDS = ("kmsg", "syslog", "text")


class Unreadable(Exception):
    """The log cannot be read; the message says why and what fixes it."""


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
        self._source: Optional[_Source] = None
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

    def _open(self) -> "_Source":
        if self.setting == AUTO:
            return self._ring()
        try:
            mode = os.stat(self.setting).st_mode
        except OSError as e:
            raise Unreadable(self._why(self.setting, e)) from None
        if stat.S_ISCHR(mode):
            return _KmsgDevice(self.setting, self._why)
        if _is_kmsg_file(self.setting):
            return _KmsgFile(self.setting, self._why)
        return _TextLog(self.setting, self._why)

    def _ring(self) -> "_Source":
        """/dev/kmsg; where it cannot be opened, the same ring through syslog(2). A container runtime lets an
        unprivileged container open only its default devices (runc's device rules: null, zero, random, tty...),
        whatever is mounted, while syslog(2) asks only for CAP_SYSLOG."""
        try:
            return _KmsgDevice(KMSG, self._why)
        except Unreadable as refused:
            try:
                ring = _SyslogCall()
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


Why = Callable[[str, OSError], str]


class _Source:
    inode: Optional[int] = None
    kind = "kmsg"
    numbered = True  # its records carry a seq; a text log's are numbered by offset, from the cursor on
    gapless = True  # the kernel's own seq: a gap is records lost

    def read(self, cursor: Cursor, boot_time: float) -> List[KernelRecord]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _KmsgDevice(_Source):
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


class _KmsgFile(_Source):
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


class _TextLog(_Source):
    """A text log the host keeps, read on from the cursor's offset while the file is the one it was in."""

    kind = "text"
    numbered = False
    end = 0  # the offset after the last whole line read

    def __init__(self, path: str, why: Why) -> None:
        self.path = path
        self._why = why

    def read(self, cursor: Cursor, boot_time: float) -> List[KernelRecord]:
        """On from the cursor's offset in the same file; else (rotated, truncated, or first seen) from its
        start, or its last FIRST_TEXT_BYTES, taking only lines after the cursor's time."""
        try:
            with open(self.path, "rb") as f:
                info = os.fstat(f.fileno())
                same_file = cursor.inode == info.st_ino and 0 <= cursor.seq <= info.st_size
                start = cursor.seq if same_file else max(0, info.st_size - FIRST_TEXT_BYTES)
                f.seek(start)
                data = f.read(MAX_TEXT_BYTES_PER_READ)
        except OSError as e:
            raise Unreadable(self._why(self.path, e)) from None
        self.inode = info.st_ino
        if not same_file and start:
            skip = data.find(b"\n") + 1  # it began inside a line: from the next
            data, start = data[skip:], start + skip
        after = boot_time if same_file else max(boot_time, cursor.time or 0.0)
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next read
        self.end = start + len(whole)
        return list(_text_records(whole, start, after, boot_time))

    def close(self) -> None:
        """Opened for each read: nothing is held."""


class _SyslogCall(_Source):
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
        if same < _SyslogCall.SAME_MICROSECOND:
            yield KernelRecord(microseconds * _SyslogCall.SAME_MICROSECOND + same, boot_time + microseconds / 1e6,
                               microseconds / 1e6, match.group(4).decode("utf-8", "replace"))


def parse_record(data: bytes, boot_time: float) -> Optional[KernelRecord]:
    """One /dev/kmsg record; None for one that is not the kernel's own or cannot be parsed."""
    head, semicolon, body = data.partition(b";")
    fields = head.split(b",", 4)
    if not semicolon or len(fields) < 4:
        return None
    try:
        prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    if prio >> 3 != KERNEL_FACILITY or seq < 0 or usec < 0:
        return None
    lines = body.split(b"\n")
    device = next((line[8:].decode("ascii", "replace") for line in lines[1:] if line.startswith(b" DEVICE=")), None)
    return KernelRecord(seq, boot_time + usec / 1e6, usec / 1e6, lines[0].decode("utf-8", "replace"), device)


def _kmsg_chunks(data: bytes) -> Iterator[bytes]:
    """A buffer of records, each with its continuation lines (which start with a space)."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        while end + 1 < len(data) and data[end + 1:end + 2] == b" ":
            end = data.find(b"\n", end + 1)
        yield data[start:end + 1]
        start = end + 1


def _text_records(data: bytes, offset: int, after: float, boot_time: float) -> Iterator[KernelRecord]:
    """The kernel's lines of a text log, each numbered by the offset after it, after `after`. An indented
    line goes on the record before it (one message the kernel printed over several lines, as /dev/kmsg
    gives it with its newlines)."""
    record: Optional[KernelRecord] = None
    for line in data.split(b"\n")[:-1]:
        offset += len(line) + 1
        text = line.decode("utf-8", "replace")
        if text[:1] in (" ", "\t") and record is not None:
            record = replace(record, seq=offset, text=f"{record.text}\n{text.strip()}")
            continue
        if record is not None:
            yield record
        parsed = _text_line(text)
        record = KernelRecord(offset, parsed[0], parsed[0] - boot_time, parsed[1]) \
            if parsed is not None and parsed[0] > after else None
    if record is not None:
        yield record


def _text_line(line: str) -> Optional[Tuple[float, str]]:
    """A text log line's time and message; None for a continuation line, or one not the kernel's."""
    for pattern, when in ((_ISO_LINE, _iso_time), (_SYSLOG_LINE, _syslog_time), (_DMESG_LINE, _dmesg_time)):
        match = pattern.fullmatch(line)
        if match is not None:
            moment = when(match.group(1))
            return None if moment is None else (moment, _UPTIME_PREFIX.sub("", match.group(2), count=1))
    return None


def _iso_time(text: str) -> Optional[float]:
    # journalctl's short-iso writes the offset without a colon (+0000), which fromisoformat takes from 3.11.
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _syslog_time(text: str) -> Optional[float]:
    """The traditional syslog time, local and without a year: this year's, or last year's where this year's
    would be in the future (a log read in early January)."""
    now = time.time()
    year = time.localtime(now).tm_year
    for candidate in (year, year - 1):
        try:
            moment = time.mktime(time.strptime(f"{candidate} {text}", "%Y %b %d %H:%M:%S"))
        except ValueError:
            return None
        if moment <= now + 86400:
            return moment
    return None


def _dmesg_time(text: str) -> Optional[float]:
    try:
        return time.mktime(time.strptime(text, "%a %b %d %H:%M:%S %Y"))
    except ValueError:
        return None


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

