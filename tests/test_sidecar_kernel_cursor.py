"""The sidecar's kernel-log cursor lives with its journal: a restart, even one after a crash between
journaling an event and writing the cursor's file, neither loses nor repeats a record."""

from gpu_monitoring.node.kernel_log import Cursor
from gpu_monitoring.sidecar import kernel_cursor
from gpu_monitoring.sidecar.journal import Journal

BOOT = "6f3c0f52-5a8e-4a07-9f0c-1d2e3f405162"


def kernel_record(seq):
    return {"device_uuid": None, "kind": "xid", "code": 13, "timestamp": 1.0, "source": "kernel",
            "boot_id": BOOT, "kernel_seq": seq}


def nvml_record():
    return {"device_uuid": "GPU-1", "kind": "xid", "code": 13, "timestamp": 1.0}


def test_a_first_start_has_no_cursor(tmp_path):
    journal = Journal(str(tmp_path))
    assert kernel_cursor.load(journal) is None
    journal.close()


def cursor_after_restart(directory, *steps):
    """The cursor a sidecar restarted on `directory` finds, after `steps` (each a journal record to
    append, or a cursor to save) and a stop."""
    journal = Journal(str(directory))
    for step in steps:
        if isinstance(step, Cursor):
            kernel_cursor.save(journal, step)
        else:
            journal.append(step)
    journal.close()
    reopened = Journal(str(directory))
    try:
        return kernel_cursor.load(reopened)
    finally:
        reopened.close()


def test_the_saved_cursor_is_read_back(tmp_path):
    # The records after 41 matched nothing: only the file says the reader got to 57.
    assert cursor_after_restart(tmp_path, kernel_record(41), Cursor(BOOT, 57)) == Cursor(BOOT, 57)


def test_events_journaled_after_the_cursor_file_move_it_on(tmp_path):
    # A crash after the last four were journaled, before the file was written again.
    found = cursor_after_restart(tmp_path, kernel_record(10), Cursor(BOOT, 10), nvml_record(), kernel_record(11),
                                 kernel_record(12), nvml_record())
    assert (found.boot_id, found.seq) == (BOOT, 12)


def test_without_its_file_the_journal_alone_gives_the_cursor(tmp_path):
    (tmp_path / kernel_cursor.STATE_FILE).parent.mkdir(exist_ok=True)
    (tmp_path / kernel_cursor.STATE_FILE).write_text("{broken")
    found = cursor_after_restart(tmp_path, *(kernel_record(seq) for seq in range(3)))
    assert (found.boot_id, found.seq) == (BOOT, 2)
