"""A text log the host keeps of the kernel's messages, read on from an offset.

Text logs, one message a line, its continuation lines indented (skipped): kern.log or syslog, in the
traditional form (`Nov 28 00:12:53 host kernel: [ 7140.123456] msg`, local time, no year) or RFC 3339
(`2026-11-28T00:12:53.123456+00:00 host kernel: msg`); `journalctl -k -o short-iso`
(`2026-11-28T00:12:53+0000 host kernel: msg`); `dmesg -T` (`[Sat Nov 28 00:12:53 2026] msg`). A line's
time is the line's own; lines from before this boot (`btime` in /proc/stat) are history, not news.
"""

import os
import re
import time
from dataclasses import replace
from typing import Iterator, List, Optional, Tuple

from gpu_monitoring.node.kernel_records import MAX_TEXT_BYTES_PER_READ, Cursor, KernelRecord, Source, Unreadable, Why

# A text log seen for the first time is read from no further back than this: what lies before is
# from earlier boots on any node that keeps its logs for days.
FIRST_TEXT_BYTES = 16 * 1024 * 1024
_ISO_LINE = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)) \S+ kernel: ?(.*)")
_SYSLOG_LINE = re.compile(r"([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) \S+ kernel: ?(.*)")
_DMESG_LINE = re.compile(r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\] ?(.*)")
_UPTIME_PREFIX = re.compile(r"\[ *\d+\.\d+\] ?")


class TextLog(Source):
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
