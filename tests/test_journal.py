"""The sidecar's event journal, on real files: numbering, paging, rotation, recovery, concurrency."""

import logging
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import List

import pytest

from gpu_monitoring.sidecar.journal import Journal, JournalLockedError

REPO = Path(__file__).resolve().parents[1]


def xid(n: int, pad: int = 0) -> dict:
    return {"kind": "xid", "code": 79, "device_uuid": f"GPU-{n:04d}", "pad": "x" * pad}


def fill(journal: Journal, count: int, pad: int = 0) -> List[int]:
    return [journal.append(xid(n, pad)) for n in range(count)]


def segments(directory: Path) -> List[Path]:
    return sorted(directory.glob("events-*.log"))


def seqs(page) -> List[int]:
    return [r["seq"] for r in page.records]


def crashed_after(directory: Path, count: int) -> None:
    """A journal of `count` records whose process died without closing it."""
    with Journal(str(directory)) as journal:
        fill(journal, count)
    # Closing records the last seq in the state file; a crash before any rotation leaves none.
    (directory / "last_seq").unlink()


def corrupt_line(path: Path, index: int) -> None:
    """Change one byte of the JSON on a line, as a bad disk block would."""
    lines = path.read_bytes().splitlines(keepends=True)
    at = lines[index].index(b"GPU-")
    lines[index] = lines[index][:at] + b"CPU-" + lines[index][at + 4:]
    path.write_bytes(b"".join(lines))


def test_seq_starts_at_one_and_increases(tmp_path):
    with Journal(str(tmp_path)) as journal:
        assert journal.last_seq == 0
        assert fill(journal, 5) == [1, 2, 3, 4, 5]
        assert journal.last_seq == 5


def test_empty_journal_reads_nothing(tmp_path):
    with Journal(str(tmp_path)) as journal:
        page = journal.read(0, 10)
    assert (page.records, page.last_seq, page.first_seq, page.lost) == ([], 0, 0, False)


def test_reopen_continues_the_sequence(tmp_path):
    with Journal(str(tmp_path)) as journal:
        fill(journal, 3)
    with Journal(str(tmp_path)) as journal:
        assert journal.last_seq == 3
        assert journal.append(xid(9)) == 4
        assert seqs(journal.read(0, 10)) == [1, 2, 3, 4]


def test_records_round_trip(tmp_path):
    record = {"kind": "ecc_dbe", "code": None, "text": "one\ntwo \u00e9\u2603", "ids": [0, 1], "nested": {"a": 1.5}}
    with Journal(str(tmp_path)) as journal:
        journal.append(record)
    with Journal(str(tmp_path)) as journal:
        assert journal.read(0, 1).records == [dict(record, seq=1)]
    assert len(segments(tmp_path)[0].read_bytes().splitlines()) == 1


def test_read_pages_by_cursor_and_limit(tmp_path):
    with Journal(str(tmp_path)) as journal:
        fill(journal, 25)
        cursor, pages = 0, []
        while True:
            page = journal.read(cursor, 10)
            assert (page.last_seq, page.first_seq, page.lost) == (25, 1, False)
            if not page.records:
                break
            pages.append(seqs(page))
            cursor = page.records[-1]["seq"]
        assert pages == [list(range(1, 11)), list(range(11, 21)), list(range(21, 26))]
        assert journal.read(25, 10).records == []
        assert journal.read(99, 10).records == []
        assert journal.read(0, 0).records == []


def test_every_cursor_reads_the_right_records_across_segments(tmp_path):
    # 1 KiB records: several index strides per segment and several segments, before and after a reopen.
    with Journal(str(tmp_path), segment_bytes=40 * 1024) as journal:
        fill(journal, 150, pad=1000)
    assert len(segments(tmp_path)) > 3
    with Journal(str(tmp_path), segment_bytes=40 * 1024) as journal:
        for cursor in range(150):
            page = journal.read(cursor, 3)
            assert seqs(page) == list(range(cursor + 1, min(cursor + 4, 151)))
            assert not page.lost


def test_rotation_bounds_segment_size_and_total(tmp_path):
    with Journal(str(tmp_path), segment_bytes=1024, max_bytes=4096) as journal:
        fill(journal, 200)
        files = segments(tmp_path)
        assert len(files) > 1
        assert all(f.stat().st_size <= 1024 for f in files)
        assert sum(f.stat().st_size for f in files) <= 4096
        for f in files:  # each segment is named after its first record
            assert int(f.stem.split("-")[1]) == int(f.read_bytes().split(b'"seq":')[1].split(b",")[0])
        page = journal.read(0, 1000)
        first = page.first_seq
        assert first > 1 and page.lost
        assert seqs(page) == list(range(first, 201))
        assert not journal.read(first - 1, 1000).lost
        assert journal.read(first - 2, 1000).lost
        assert journal.read(0, 0).lost and not journal.read(first - 1, 0).lost


def test_seq_never_restarts_after_rotation_deleted_everything(tmp_path):
    # max_bytes == segment_bytes: every rotation deletes all older segments.
    with Journal(str(tmp_path), segment_bytes=1024, max_bytes=1024) as journal:
        fill(journal, 50)
        assert len(segments(tmp_path)) == 1
    with Journal(str(tmp_path), segment_bytes=1024, max_bytes=1024) as journal:
        assert journal.last_seq == 50
        assert journal.append(xid(0)) == 51
    for f in segments(tmp_path):
        f.unlink()
    with Journal(str(tmp_path)) as journal:
        page = journal.read(10, 5)
        assert (page.records, page.last_seq, page.first_seq, page.lost) == ([], 51, 0, True)
        assert journal.append(xid(0)) == 52


def test_truncated_last_record_is_cut_off(tmp_path):
    crashed_after(tmp_path, 5)
    segment = segments(tmp_path)[0]
    good_size = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(b'1a2b3c4d {"seq":6,"kind":"xi')
    with Journal(str(tmp_path)) as journal:
        assert journal.last_seq == 5
        assert segment.stat().st_size == good_size
        assert seqs(journal.read(0, 10)) == [1, 2, 3, 4, 5]
        assert journal.append(xid(6)) == 6
    with Journal(str(tmp_path)) as journal:
        page = journal.read(0, 10)
        assert seqs(page) == [1, 2, 3, 4, 5, 6] and not page.lost
        assert page.records[-1]["device_uuid"] == "GPU-0006"


def test_corrupted_last_line_is_cut_off_and_its_seq_not_reused(tmp_path):
    # A whole line with a bad checksum was written and fsync'd: a reader may have passed its seq.
    crashed_after(tmp_path, 5)
    corrupt_line(segments(tmp_path)[0], 4)
    with Journal(str(tmp_path)) as journal:
        assert journal.last_seq == 5
        assert journal.append(xid(5)) == 6
        page = journal.read(0, 10)
        assert seqs(page) == [1, 2, 3, 4, 6] and page.lost
        assert not journal.read(5, 10).lost


def test_corrupted_line_in_the_middle_is_skipped_with_one_warning(tmp_path, caplog):
    with Journal(str(tmp_path)) as journal:
        fill(journal, 5)
    corrupt_line(segments(tmp_path)[0], 2)
    with caplog.at_level(logging.WARNING, logger="gpu_monitoring.sidecar.journal"):
        with Journal(str(tmp_path)) as journal:
            assert journal.last_seq == 5
            page = journal.read(0, 10)
            assert seqs(page) == [1, 2, 4, 5] and page.lost
            assert journal.read(2, 10).lost
            page = journal.read(3, 10)
            assert seqs(page) == [4, 5] and not page.lost
            assert journal.append(xid(6)) == 6
    assert len([r for r in caplog.records if "corrupted record" in r.getMessage()]) == 1


def test_corrupted_tail_of_acknowledged_records_does_not_reuse_their_seqs(tmp_path):
    crashed_after(tmp_path, 5)
    for index in (3, 4):
        corrupt_line(segments(tmp_path)[0], index)
    with Journal(str(tmp_path)) as journal:
        # Both lines were written whole: neither seq is handed out again.
        assert journal.last_seq == 5
        assert journal.append(xid(5)) == 6
        page = journal.read(0, 10)
        assert seqs(page) == [1, 2, 3, 6] and page.lost


def test_corrupted_last_line_after_a_clean_close_keeps_its_seq(tmp_path):
    with Journal(str(tmp_path)) as journal:
        fill(journal, 5)
    corrupt_line(segments(tmp_path)[0], 4)
    with Journal(str(tmp_path)) as journal:
        # The clean close recorded that seq 5 was acknowledged, so it is not handed out again.
        assert journal.append(xid(6)) == 6
        page = journal.read(0, 10)
        assert seqs(page) == [1, 2, 3, 4, 6] and page.lost


def test_old_segment_corruption_is_skipped_on_read(tmp_path):
    with Journal(str(tmp_path), segment_bytes=1024) as journal:
        fill(journal, 30)
    oldest = segments(tmp_path)[0]
    corrupt_line(oldest, 1)
    with Journal(str(tmp_path), segment_bytes=1024) as journal:
        page = journal.read(0, 100)
        assert seqs(page) == [1] + list(range(3, 31)) and page.lost


def test_concurrent_appends_get_unique_gap_free_seqs(tmp_path):
    threads, per_thread = 4, 50
    got: List[int] = []
    bad_pages: List[list] = []
    with Journal(str(tmp_path), segment_bytes=2048) as journal:

        def writer(n: int) -> None:
            got.extend(journal.append(xid(n)) for _ in range(per_thread))

        def reader() -> None:
            for _ in range(100):
                page = journal.read(0, 1000)
                if seqs(page) != list(range(1, len(page.records) + 1)):
                    bad_pages.append(seqs(page))

        workers = [threading.Thread(target=writer, args=(n,)) for n in range(threads)]
        workers.append(threading.Thread(target=reader))
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        total = threads * per_thread
        assert sorted(got) == list(range(1, total + 1))
        assert not bad_pages
        assert seqs(journal.read(0, total + 10)) == list(range(1, total + 1))


def test_process_killed_after_append_loses_nothing(tmp_path):
    script = (
        "import os, sys\n"
        "from gpu_monitoring.sidecar.journal import Journal\n"
        "journal = Journal(sys.argv[1])\n"
        "for n in range(200):\n"
        "    journal.append({'kind': 'xid', 'code': n})\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, check=True, timeout=60)
    with Journal(str(tmp_path)) as journal:
        page = journal.read(0, 500)
        assert seqs(page) == list(range(1, 201))
        assert [r["code"] for r in page.records] == list(range(200))
        assert journal.append({"kind": "xid"}) == 201


def test_directory_is_private_and_held_by_one_journal(tmp_path):
    directory = tmp_path / "state" / "journal"
    umask = os.umask(0o022)
    try:
        journal = Journal(str(directory))
        journal.append(xid(0))
    finally:
        os.umask(umask)
    with journal:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        # Every file, the segments and the small state files alike, under a permissive umask too.
        assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in directory.iterdir()} == {
            path.name: 0o600 for path in directory.iterdir()}
        with pytest.raises(JournalLockedError):
            Journal(str(directory))
    with Journal(str(directory)) as journal:
        assert journal.last_seq == 1


def test_bad_records_are_refused_without_using_a_seq(tmp_path):
    with Journal(str(tmp_path)) as journal:
        with pytest.raises(ValueError):
            journal.append({"seq": 7})
        with pytest.raises(ValueError):
            journal.append({"value": float("nan")})
        with pytest.raises(TypeError):
            journal.append({"value": object()})
        assert journal.append(xid(0)) == 1


def test_closed_journal_refuses_use(tmp_path):
    journal = Journal(str(tmp_path))
    journal.close()
    journal.close()
    with pytest.raises(ValueError):
        journal.append(xid(0))
    with pytest.raises(ValueError):
        journal.read(0, 1)


def test_settings_are_checked(tmp_path):
    with pytest.raises(ValueError):
        Journal(str(tmp_path), segment_bytes=2048, max_bytes=1024)
    assert not os.listdir(tmp_path)


def test_failed_append_is_undone_and_its_seq_reused(tmp_path):
    # The file size limit makes the kernel accept only part of the line, then refuse the rest (EFBIG).
    script = (
        "import glob, os, resource, signal, sys\n"
        "from gpu_monitoring.sidecar.journal import Journal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "journal = Journal(sys.argv[1])\n"
        "journal.append({'code': 1})\n"
        "segment = glob.glob(os.path.join(sys.argv[1], 'events-*.log'))[0]\n"
        "size = os.path.getsize(segment)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (size + 10, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    journal.append({'code': 2})\n"
        "    sys.exit('the append did not fail')\n"
        "except OSError:\n"
        "    pass\n"
        "assert os.path.getsize(segment) == size\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "assert journal.append({'code': 3}) == 2\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, check=True, timeout=60)
    with Journal(str(tmp_path)) as journal:
        page = journal.read(0, 10)
        assert [(r["seq"], r["code"]) for r in page.records] == [(1, 1), (2, 3)] and not page.lost


KILLED_AFTER_A_READ = (
    "import os, sys\n"
    "from gpu_monitoring.sidecar.journal import Journal\n"
    "journal = Journal(sys.argv[1])\n"
    "for n in range(5):\n"
    "    journal.append({'kind': 'xid', 'code': n, 'device_uuid': 'GPU-0'})\n"
    "assert len(journal.read(0, 10).records) == 5\n"
    "print(journal.epoch)\n"
    "os._exit(0)\n"
)


def killed_after_a_read(directory: Path) -> str:
    """Five records a reader has read, then the process dies without closing: returns the epoch."""
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_A_READ, str(directory)], cwd=REPO, check=True,
                          timeout=60, capture_output=True, text=True)
    return done.stdout.strip()


@pytest.mark.parametrize("damage", ["cut at a line", "cut mid-line", "flipped byte"])
def test_seqs_a_reader_passed_are_never_handed_out_again(tmp_path, damage):
    epoch = killed_after_a_read(tmp_path)
    segment = segments(tmp_path)[0]
    lines = segment.read_bytes().splitlines(keepends=True)
    if damage == "flipped byte":
        corrupt_line(segment, 4)
    else:
        segment.write_bytes(b"".join(lines[:4]) + (lines[4][:20] if damage == "cut mid-line" else b""))
    with Journal(str(tmp_path)) as journal:
        assert journal.epoch == epoch
        assert journal.append(xid(6)) == 6
        page = journal.read(4, 10)
        assert seqs(page) == [6] and page.lost


def test_a_journal_keeps_its_epoch_and_a_wiped_one_gets_a_new_one(tmp_path):
    with Journal(str(tmp_path)) as journal:
        epoch = journal.epoch
        fill(journal, 3)
        assert journal.read(0, 10).epoch == epoch
    assert len(epoch) == 32 and int(epoch, 16) >= 0
    with Journal(str(tmp_path)) as journal:
        assert journal.epoch == epoch
        assert journal.append(xid(0)) == 4
    for path in tmp_path.iterdir():
        path.unlink()
    with Journal(str(tmp_path)) as journal:
        assert journal.epoch != epoch
        assert journal.append(xid(0)) == 1


def test_a_damaged_epoch_is_replaced_and_numbering_goes_on(tmp_path, caplog):
    with Journal(str(tmp_path)) as journal:
        epoch = journal.epoch
        fill(journal, 3)
    (tmp_path / "epoch").write_text("not an epoch\n")
    with caplog.at_level(logging.WARNING, logger="gpu_monitoring.sidecar.journal"):
        with Journal(str(tmp_path)) as journal:
            assert journal.epoch not in (epoch, "not an epoch")
            assert journal.append(xid(0)) == 4
    assert any("no readable epoch" in r.getMessage() for r in caplog.records)


def test_records_wait_while_the_read_mark_cannot_be_written(tmp_path):
    script = (
        "import resource, sys\n"
        "from gpu_monitoring.sidecar.journal import Journal\n"
        "journal = Journal(sys.argv[1])\n"
        "for n in range(3):\n"
        "    journal.append({'code': n})\n"
        "assert [r['seq'] for r in journal.read(0, 10).records] == [1, 2, 3]\n"
        "journal.append({'code': 3})\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))\n"
        "page = journal.read(0, 10)\n"
        "assert [r['seq'] for r in page.records] == [1, 2, 3] and not page.lost, page\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "page = journal.read(0, 10)\n"
        "assert [r['seq'] for r in page.records] == [1, 2, 3, 4] and not page.lost, page\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, check=True, timeout=60)
