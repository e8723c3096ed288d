"""A record of the kernel's log and where a reader stands in it, whichever way the log is read.

The cursor is the boot ID with the last record's `seq` (a text log: the offset after the last line
read, with the file's inode and that line's time). A cursor of another boot starts at the first
record of this one; without a cursor every record of this boot still in the ring is read, once.
"""

import json
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional

MAX_RECORD_BYTES = 8192  # CONSOLE_EXT_LOG_MAX: the largest record /dev/kmsg hands out
# A read takes at most this many records (a full 1 MiB ring holds about 10,000) or text bytes; the
# rest wait for the next read.
MAX_RECORDS_PER_READ = 50_000
MAX_TEXT_BYTES_PER_READ = 8 * 1024 * 1024
# Records user space writes to /dev/kmsg have facility LOG_USER unless they say otherwise: only the
# kernel's own (facility 0) are read.
KERNEL_FACILITY = 0


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
    # /dev/kmsg: the last record read; syslog(2): the last line's, numbered by its time (SyslogCall); a text
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


Why = Callable[[str, OSError], str]


class Source:
    inode: Optional[int] = None
    kind = "kmsg"
    numbered = True  # its records carry a seq; a text log's are numbered by offset, from the cursor on
    gapless = True  # the kernel's own seq: a gap is records lost

    def read(self, cursor: Cursor, boot_time: float) -> List[KernelRecord]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


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
