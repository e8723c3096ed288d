"""The sidecar's append-only event journal: every record gets the next sequence number and is on disk
(fsync'd) before `append` returns, so a crash never loses an acknowledged event.

On disk, a directory of segments `events-<first seq, 20 digits>.log`, one record a line:
`<crc32 of the JSON, 8 hex digits> <compact JSON with "seq" first>\\n`. The newest segment is
the one appended to; the oldest whole segments are deleted to keep the total under `max_bytes`.
The newest segment is never deleted and its name is the next seq while it is empty, so seqs never
go backwards; a `last_seq` state file, rewritten atomically before deletions, on close and when a
read first hands out a record, keeps that true even if the segments themselves are removed or cut.

Each journal has an identity, its `epoch`: a random id created with it and kept in an `epoch` file.
A reader stores it with its cursor. Within an epoch seqs never go backwards, so a cursor stays
valid; a journal whose directory was wiped is a new journal with a new epoch, numbered from 1
again, and a reader that meets an epoch it does not know reads that journal from its start.

Recovery on open scans the newest segment only:
- The tail after the last good line (an append cut short by a crash, or a corrupted last line) is
  truncated away. Only a final line without its newline can be an append that was cut short and
  so never acknowledged: its seq is handed out again. Every other bad line was written whole and
  fsync'd, so a reader may have passed it: its seq is skipped (readers see `lost`), never reused.
- A corrupted line followed by good ones is kept in the file and skipped, with one warning.

Readers learn of anything they cannot get: `JournalPage.lost` is True when records after their
cursor were rotated away or are unreadable (seqs are handed out without gaps, so a gap means loss).
"""

import errno
import fcntl
import json
import logging
import os
import re
import sys
import threading
import uuid
import zlib
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

log = logging.getLogger(__name__)

SEGMENT_NAME = re.compile(r"events-(\d{20})\.log")
STATE_FILE = "last_seq"
EPOCH_FILE = "epoch"
# Reads seek to the nearest indexed line at or before the cursor, then parse at most this many bytes
# of older lines: cheap enough per read, and a 64 MiB journal needs only a few thousand index entries.
INDEX_STRIDE = 16 * 1024


class JournalLockedError(RuntimeError):
    """Another journal (in this or another process) has the directory open: seqs need one writer."""


@dataclass
class JournalPage:
    """Records after a cursor (each with its "seq"); first_seq is 0 when no record is on disk."""

    records: List[dict]
    last_seq: int
    first_seq: int
    lost: bool
    epoch: str = ""


@dataclass
class _Segment:
    first_seq: int
    path: str
    size: int
    # (seq, byte offset) of lines every INDEX_STRIDE bytes; None until a read needs it.
    marks: Optional[List[Tuple[int, int]]] = None
    corrupt_warned: Set[int] = field(default_factory=set)


class Journal:
    def __init__(self, directory: str, segment_bytes: int = 4 * 1024 * 1024, max_bytes: int = 64 * 1024 * 1024):
        if segment_bytes <= 0 or max_bytes < segment_bytes:
            raise ValueError("need 0 < segment_bytes <= max_bytes")
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._closed = False
        self._broken: Optional[str] = None
        self._mark_problem: Optional[str] = None
        self._fd: Optional[int] = None
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._claim_directory()
            self._open_existing()
        except BaseException:
            self._release()
            raise

    # --- the API ------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        return self._last_seq

    @property
    def epoch(self) -> str:
        return self._epoch

    def append(self, record: Mapping[str, Any]) -> int:
        """Journal one record; returns its seq once the record is fsync'd."""
        if "seq" in record:
            raise ValueError("the journal assigns 'seq'; the record must not carry one")
        with self._lock:
            self._check_usable()
            seq = self._last_seq + 1
            line = _encode(seq, record)
            active = self._segments[-1]
            if active.size and active.size + len(line) > self.segment_bytes:
                active = self._rotate(seq)
            offset = active.size
            self._write(active, line)
            self._last_seq = seq
            if not active.marks or offset - active.marks[-1][1] >= INDEX_STRIDE:
                active.marks.append((seq, offset))
            return seq

    def read(self, after: int, limit: int) -> JournalPage:
        """Records with seq > after, oldest first, at most `limit` of them."""
        if limit < 0:
            raise ValueError("limit must not be negative")
        with self._lock:
            self._check_open()
            after = max(after, 0)
            records, limit = self._mark_served(self._collect(after + 1, limit), limit)
            first = self._segments[0].first_seq if self._segments[0].first_seq <= self._last_seq else 0
            return JournalPage(records, self._last_seq, first, self._lost(after, records, limit, first), self._epoch)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._broken is None:
                    self._save_state()
            finally:
                self._release()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        os.close(self._dir_fd)  # also drops the directory lock

    # --- opening and recovery -----------------------------------------------------------

    def _claim_directory(self) -> None:
        try:
            fcntl.flock(self._dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise JournalLockedError(f"the journal in {self.directory} is open elsewhere") from e
            raise

    def _open_existing(self) -> None:
        self._segments = self._list_segments()
        self._last_seq = self._saved_seq = self._load_state()
        self._epoch = self._load_epoch()
        if self._segments:
            newest = self._segments[-1]
            self._fd = _open_for_append(newest.path)
            self._last_seq = max(self._last_seq, self._recover(newest))
        else:
            self._start_segment(self._last_seq + 1)
        self._prune()

    def _list_segments(self) -> List[_Segment]:
        segments = []
        for name in os.listdir(self.directory):
            match = SEGMENT_NAME.fullmatch(name)
            if match:
                path = os.path.join(self.directory, name)
                segments.append(_Segment(int(match.group(1)), path, os.path.getsize(path)))
        return sorted(segments, key=lambda s: s.first_seq)

    def _recover(self, segment: _Segment) -> int:
        """Index the segment, cut off a bad tail; returns the last seq it holds (or skips)."""
        with open(segment.path, "rb") as f:
            data = f.read()
        segment.marks = []
        last, good_end, bad = segment.first_seq - 1, 0, []
        for offset, line in _lines(data):
            record = _decode(line)
            if record is None or record["seq"] <= last:
                bad.append(offset)
                continue
            for bad_offset in bad:
                self._warn_corrupt(segment, bad_offset)
            last, good_end, bad = record["seq"], offset + len(line), []
            if not segment.marks or offset - segment.marks[-1][1] >= INDEX_STRIDE:
                segment.marks.append((last, offset))
        segment.size = good_end
        if bad:
            log.warning("journal %s: cutting %d bad bytes after seq %d (an append cut short, or corruption)",
                        segment.path, len(data) - good_end, last)
            os.ftruncate(self._fd, good_end)
            os.fsync(self._fd)
            last += len(bad) - (not data.endswith(b"\n"))
        return last

    def _load_epoch(self) -> str:
        path = os.path.join(self.directory, EPOCH_FILE)
        try:
            with open(path) as f:
                epoch = f.read().strip()
        except FileNotFoundError:
            epoch = ""
        if re.fullmatch(r"[0-9a-f]{32}", epoch):
            return epoch
        if epoch or self._segments or self._last_seq:
            log.warning("journal %s has no readable epoch; starting a new one, so readers read it from its start",
                        self.directory)
        epoch = uuid.uuid4().hex
        self._replace_file(EPOCH_FILE, epoch)
        return epoch

    def _load_state(self) -> int:
        path = os.path.join(self.directory, STATE_FILE)
        try:
            with open(path) as f:
                return int(f.read())
        except FileNotFoundError:
            return 0
        except ValueError:
            log.warning("journal state file %s is unreadable; relying on the segments", path)
            return 0

    # --- writing ------------------------------------------------------------------------

    def _write(self, segment: _Segment, line: bytes) -> None:
        try:
            _write_all(self._fd, line)
            os.fsync(self._fd)
        except OSError:
            self._undo_write(segment.size)
            raise
        segment.size += len(line)

    def _undo_write(self, size: int) -> None:
        # A partial line left in place would merge with the next append into one corrupt line.
        try:
            os.ftruncate(self._fd, size)
            os.fsync(self._fd)
        except OSError as e:
            self._broken = f"a failed append could not be undone ({e}); reopen the journal to recover it"
            log.error("journal %s: %s", self.directory, self._broken)

    def _rotate(self, first_seq: int) -> _Segment:
        segment = self._start_segment(first_seq)
        self._prune()
        return segment

    def _start_segment(self, first_seq: int) -> _Segment:
        """Create a segment and make it the one appended to."""
        path = os.path.join(self.directory, f"events-{first_seq:020d}.log")
        fd = _open_for_append(path)
        os.fsync(self._dir_fd)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        segment = _Segment(first_seq, path, 0, marks=[])
        self._segments.append(segment)
        return segment

    def _prune(self) -> None:
        """Delete the oldest whole segments so the rest plus a full newest segment fit in max_bytes."""
        doomed = []
        closed_bytes = sum(s.size for s in self._segments[:-1])
        while len(self._segments) - len(doomed) > 1 and closed_bytes + self.segment_bytes > self.max_bytes:
            doomed.append(self._segments[len(doomed)])
            closed_bytes -= doomed[-1].size
        if not doomed:
            return
        self._save_state()
        for segment in doomed:
            os.unlink(segment.path)
        del self._segments[:len(doomed)]
        os.fsync(self._dir_fd)

    def _save_state(self) -> None:
        self._replace_file(STATE_FILE, str(self._last_seq))
        self._saved_seq = self._last_seq

    def _replace_file(self, name: str, text: str) -> None:
        """Write a small file so that a crash leaves either the old or the new one, never half."""
        path = os.path.join(self.directory, name)
        # Owner-only like the segments, whatever the umask: the journal is the sidecar's alone.
        with open(os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(f"{text}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        os.fsync(self._dir_fd)

    # --- reading ------------------------------------------------------------------------

    def _collect(self, start: int, limit: int) -> List[dict]:
        records: List[dict] = []
        firsts = [s.first_seq for s in self._segments]
        for segment in self._segments[max(bisect_right(firsts, start) - 1, 0):]:
            if len(records) >= limit:
                break
            records += self._read_segment(segment, start, limit - len(records))
        return records

    def _read_segment(self, segment: _Segment, start: int, limit: int) -> List[dict]:
        records: List[dict] = []
        offset = self._offset_before(segment, start)
        with open(segment.path, "rb") as f:
            f.seek(offset)
            # Stop at the size known to hold whole, fsync'd lines, not at the end of the file.
            while offset < segment.size and len(records) < limit:
                line = f.readline(segment.size - offset)
                if not line:  # shorter than it was: truncated behind the journal's back
                    break
                record = _decode(line)
                if record is None:
                    self._warn_corrupt(segment, offset)
                elif record["seq"] >= start:
                    records.append(record)
                offset += len(line)
        return records

    def _offset_before(self, segment: _Segment, start: int) -> int:
        if segment.marks is None:
            segment.marks = _index(segment)
        i = bisect_right(segment.marks, (start, sys.maxsize)) - 1
        return segment.marks[i][1] if i >= 0 else 0

    def _mark_served(self, records: List[dict], limit: int) -> Tuple[List[dict], int]:
        """A reader is about to pass these seqs: the state file records them first, so that no crash
        or damage hands them out again. Where it cannot (a full disk), newer records wait."""
        if not records or records[-1]["seq"] <= self._saved_seq:
            return records, limit
        try:
            self._save_state()
        except OSError as e:
            if str(e) != self._mark_problem:
                log.warning("journal %s: cannot record how far readers got (%s); holding back records after %d",
                            self.directory, e, self._saved_seq)
            self._mark_problem = str(e)
            kept = [r for r in records if r["seq"] <= self._saved_seq]
            return kept, len(kept)  # as if the page were full: it says nothing of what follows
        self._mark_problem = None
        return records, limit

    def _lost(self, after: int, records: List[dict], limit: int, first_seq: int) -> bool:
        # Seqs are handed out without gaps: any gap after the cursor is a record the reader missed.
        previous = after
        for record in records:
            if record["seq"] != previous + 1:
                return True
            previous = record["seq"]
        if len(records) < limit:
            return previous < self._last_seq
        oldest = first_seq or self._last_seq + 1
        return not records and after < oldest - 1

    def _warn_corrupt(self, segment: _Segment, offset: int) -> None:
        if offset not in segment.corrupt_warned:
            segment.corrupt_warned.add(offset)
            log.warning("journal %s: skipping a corrupted record at byte %d", segment.path, offset)

    # --- state checks -------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the journal is closed")

    def _check_usable(self) -> None:
        self._check_open()
        if self._broken is not None:
            raise OSError(self._broken)


def _encode(seq: int, record: Mapping[str, Any]) -> bytes:
    # ASCII-only JSON cannot contain a raw newline, so one record is always exactly one line.
    body = json.dumps({"seq": seq, **record}, separators=(",", ":"), allow_nan=False).encode("ascii")
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _decode(line: bytes) -> Optional[Dict[str, Any]]:
    """The record on a whole line (newline included), or None if the line is torn or corrupted."""
    if len(line) < 11 or line[8:9] != b" " or not line.endswith(b"\n"):
        return None
    body = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        record = json.loads(body)
    except ValueError:
        return None
    if not isinstance(record, dict) or type(record.get("seq")) is not int:
        return None
    return record


def _lines(data: bytes):
    """(offset, line) for each line of data, the last one possibly without its newline."""
    offset = 0
    while offset < len(data):
        end = data.find(b"\n", offset) + 1 or len(data)
        yield offset, data[offset:end]
        offset = end


def _index(segment: _Segment) -> List[Tuple[int, int]]:
    """Marks for a segment that no read has needed yet: one good line every INDEX_STRIDE bytes."""
    with open(segment.path, "rb") as f:
        data = f.read(segment.size)
    marks: List[Tuple[int, int]] = []
    position = INDEX_STRIDE
    while position < len(data):
        begin = data.find(b"\n", position - 1) + 1
        if not begin:
            break
        record = _decode(data[begin:data.find(b"\n", begin) + 1])
        if record is not None and (not marks or record["seq"] > marks[-1][0]):
            marks.append((record["seq"], begin))
        position = begin + INDEX_STRIDE
    return marks


def _open_for_append(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
