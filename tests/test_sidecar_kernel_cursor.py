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


def test_the_saved_cursor_is_read_back(tmp_path):
    journal = Journal(str(tmp_path))
    journal.append(kernel_record(41))
    kernel_cursor.save(journal, Cursor(BOOT, 57))  # records after 41 matched nothing
    journal.close()
    reopened = Journal(str(tmp_path))
    assert kernel_cursor.load(reopened) == Cursor(BOOT, 57)
    reopened.close()


def test_events_journaled_after_the_cursor_file_move_it_on(tmp_path):
    journal = Journal(str(tmp_path))
    journal.append(kernel_record(10))
    kernel_cursor.save(journal, Cursor(BOOT, 10))
    # A crash after these were journaled, before the file was written again.
    journal.append(nvml_record())
    journal.append(kernel_record(11))
    journal.append(kernel_record(12))
    journal.append(nvml_record())
    journal.close()
    reopened = Journal(str(tmp_path))
    assert kernel_cursor.load(reopened) == Cursor(BOOT, 12)
    reopened.close()


def test_without_its_file_the_journal_alone_gives_the_cursor(tmp_path):
    journal = Journal(str(tmp_path))
    for seq in range(3):
        journal.append(kernel_record(seq))
    journal.close()
    (tmp_path / kernel_cursor.STATE_FILE).write_text("{broken")
    reopened = Journal(str(tmp_path))
    assert kernel_cursor.load(reopened) == Cursor(BOOT, 2)
    reopened.close()
