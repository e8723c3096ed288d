"""Where the sidecar stopped reading the kernel's log, kept beside its journal so a restart neither loses
nor repeats a record.

The journal is what counts: every kernel event it holds carries the boot ID and the kernel's seq of
its record. A state file (`kernel_cursor`: the cursor, and the journal's last seq when it was written)
saves reading the journal from its start: on open, the journal's records after that seq are read and
the last kernel event among them, if any, moves the cursor on. So a crash between journaling an
event and writing the file repeats nothing.
"""

import json
import os
from typing import Optional

from gpu_monitoring.node.kernel_log import Cursor
from gpu_monitoring.sidecar.journal import Journal

STATE_FILE = "kernel_cursor"
_PAGE = 1000


def load(journal: Journal) -> Optional[Cursor]:
    """The cursor the journal and its state file give; None where neither has one (a first start)."""
    cursor, after = _saved(journal.directory)
    while after < journal.last_seq:
        page = journal.read(after, _PAGE)
        for record in page.records:
            if record.get("source") == "kernel" and type(record.get("kernel_seq")) is int:
                when = record.get("timestamp")
                cursor = Cursor(record.get("boot_id"), record["kernel_seq"],
                                time=float(when) if type(when) in (int, float) else None,
                                kind=cursor.kind if cursor is not None else "kmsg")
        if page.last_seq <= after:
            break
        after = page.last_seq
    return cursor


def save(journal: Journal, cursor: Cursor) -> None:
    """Write the state file atomically (a rename), naming the journal's last seq it is good for."""
    path = os.path.join(journal.directory, STATE_FILE)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="ascii") as f:
        json.dump({"cursor": json.loads(cursor.dumps()), "journal_seq": journal.last_seq}, f)
    os.replace(temporary, path)


def _saved(directory: str):
    try:
        with open(os.path.join(directory, STATE_FILE), encoding="ascii") as f:
            raw = json.load(f)
        seq = raw["journal_seq"]
        cursor = Cursor.loads(json.dumps(raw["cursor"]))
        if type(seq) is int and seq >= 0:
            return cursor, seq
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None, 0
