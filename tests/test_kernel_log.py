"""The kernel's log read from where it stopped: /dev/kmsg's records, a file of them, text logs; the cursor
across restarts and reboots; records lost to the ring; an unreadable log said once, with its fix."""

import errno
import logging
import os
import time

import pytest

from gpu_monitoring.node.kernel_log import Cursor, KernelLog, parse_record

BOOT = "6f3c0f52-5a8e-4a07-9f0c-1d2e3f405162"
BTIME = 1795800000


def proc_root(tmp_path, btime=BTIME):
    root = tmp_path / "proc"
    root.mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu  1 2 3 4\nintr 0\nctxt 1\nbtime {btime}\nprocesses 10\n")
    return str(root)


def kmsg_line(seq, usec, text, prio=4, device=None):
    extra = f" SUBSYSTEM=pci\n DEVICE=+pci:{device}\n" if device else ""
    return f"{prio},{seq},{usec},-;{text}\n{extra}"


def write_kmsg(path, records):
    path.write_text("".join(kmsg_line(*record) for record in records))


def test_a_record_is_parsed_with_its_time_and_device():
    record = parse_record(b"3,1202,7140123456,-;pcieport 0000:00:01.0: AER: Corrected error received: "
                          b"0000:01:00.0\n SUBSYSTEM=pci\n DEVICE=+pci:0000:00:01.0\n", BTIME)
    assert record.seq == 1202
    assert record.uptime == pytest.approx(7140.123456)
    assert record.timestamp == pytest.approx(BTIME + 7140.123456)
    assert record.text == "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0"
    assert record.device == "+pci:0000:00:01.0"


@pytest.mark.parametrize("data", [
    b"garbage",
    b"4,x,1,-;text",
    b"4,1,-5,-;text",
    b"4,1;text",
    # Facility 1 (LOG_USER): a message user space wrote to /dev/kmsg, which could say anything.
    b"12,7,100,-;NVRM: Xid (PCI:0000:9b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
])
def test_what_is_not_the_kernels_own_record_is_refused(data):
    assert parse_record(data, BTIME) is None


def test_a_kmsg_file_is_read_once_and_on_from_its_cursor(tmp_path):
    path = tmp_path / "kmsg"
    write_kmsg(path, [(0, 1000, "Linux version 6.8"), (1, 2000, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module")])
    log = KernelLog(str(path), proc_root(tmp_path), BOOT)
    assert [r.seq for r in log.read()] == [0, 1]
    assert log.read() == []
    with open(path, "a") as f:
        f.write(kmsg_line(2, 3000, "NVRM: Xid (PCI:0000:9b:00): 13, pid=4711, name=python, Graphics Exception"))
    new = log.read()
    assert [r.seq for r in new] == [2] and new[0].timestamp == pytest.approx(BTIME + 0.003)
    assert log.cursor == Cursor(BOOT, 2, log.cursor.inode, new[0].timestamp)


def test_a_restart_in_the_same_boot_goes_on_from_the_cursor(tmp_path):
    path = tmp_path / "kmsg"
    write_kmsg(path, [(seq, seq * 1000, f"record {seq}") for seq in range(5)])
    stored = Cursor.loads(Cursor(BOOT, 2).dumps())
    assert [r.seq for r in KernelLog(str(path), proc_root(tmp_path), BOOT, stored).read()] == [3, 4]


def test_a_new_boot_is_read_from_its_first_record(tmp_path):
    path = tmp_path / "kmsg"
    write_kmsg(path, [(seq, seq * 1000, f"record {seq}") for seq in range(3)])
    earlier_boot = Cursor("0b5e2c1e-0000-4000-8000-000000000001", 40)
    log = KernelLog(str(path), proc_root(tmp_path), BOOT, earlier_boot)
    assert [r.seq for r in log.read()] == [0, 1, 2]
    assert log.lost == 0


def test_records_the_ring_overwrote_are_counted_lost_and_told_once(tmp_path, caplog):
    path = tmp_path / "kmsg"
    write_kmsg(path, [(seq, seq, f"record {seq}") for seq in range(3)])
    log = KernelLog(str(path), proc_root(tmp_path), BOOT)
    log.read()
    # The ring wraps: the file is replaced by one that keeps only the newest records.
    replacement = tmp_path / "kmsg.new"
    write_kmsg(replacement, [(seq, seq, f"record {seq}") for seq in range(10, 13)])
    os.replace(replacement, path)
    with caplog.at_level(logging.INFO, logger="gpu_monitoring.node.kernel_log"):
        assert [r.seq for r in log.read()] == [10, 11, 12]
        assert log.read() == []
    assert log.lost == 7
    assert sum("overwrote 7 records" in r.getMessage() for r in caplog.records) == 1


def test_a_record_being_written_waits_for_the_next_read(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text(kmsg_line(0, 1, "whole") + "4,1,2,-;half a rec")
    log = KernelLog(str(path), proc_root(tmp_path), BOOT)
    assert [r.text for r in log.read()] == ["whole"]
    with open(path, "a") as f:
        f.write("ord\n")
    assert [r.text for r in log.read()] == ["half a record"]


def test_the_real_kmsg_device_reads_to_eagain_and_then_nothing_new():
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("this machine's /dev/kmsg cannot be read")
    from gpu_monitoring.node.boot import read_boot_id

    log = KernelLog("auto", "/proc", read_boot_id("/proc"))
    first = log.read()
    assert log.problem is None and first, "a booted kernel's ring holds records"
    assert all(a.seq < b.seq for a, b in zip(first, first[1:]))
    assert abs(first[-1].timestamp - time.time()) < 10 * 365 * 86400
    again = log.read()
    assert all(record.seq > first[-1].seq for record in again)


def test_a_missing_kmsg_says_what_to_mount_once(tmp_path, caplog):
    log = KernelLog(str(tmp_path / "no-such-log"), proc_root(tmp_path), BOOT)
    with caplog.at_level(logging.WARNING, logger="gpu_monitoring.node.kernel_log"):
        assert log.read() == [] and log.read() == []
    assert "kernel_log to none" in log.problem
    assert len(caplog.records) == 1


def test_kmsg_denied_names_the_capability(tmp_path):
    log = KernelLog("auto", proc_root(tmp_path), BOOT)
    why = log._why("/dev/kmsg", OSError(errno.EPERM, "Operation not permitted"))
    assert "CAP_SYSLOG" in why and "dmesg_restrict" in why
    absent = log._why("/dev/kmsg", OSError(errno.ENOENT, "No such file or directory"))
    assert "mount the host's /dev/kmsg read-only" in absent


def test_none_reads_nothing(tmp_path):
    log = KernelLog("none", proc_root(tmp_path), BOOT)
    assert log.read() == [] and log.problem is None and not log.enabled


# Text logs: each form's line, with what is before this boot left out as history.
NOW = time.time()
BOOTED = int(NOW - 3600)


def _local(moment, form):
    return time.strftime(form, time.localtime(moment))


def test_kern_log_lines_after_boot_are_read_with_their_own_time(tmp_path):
    path = tmp_path / "kern.log"
    before, after = BOOTED - 600, BOOTED + 60
    path.write_text(
        f"{_local(before, '%b %d %H:%M:%S')} gpu-node-7 kernel: [ 9000.000001] NVRM: Xid (PCI:0000:9b:00): 79, "
        "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        f"{_local(after, '%b %d %H:%M:%S')} gpu-node-7 kernel: [   60.000001] NVRM: Xid (PCI:0000:9b:00): 13, "
        "pid=4711, name=python, Graphics Exception\n"
        f"{_local(after, '%b %d %H:%M:%S')} gpu-node-7 systemd[1]: Started Session 3 of user root.\n"
        "    a continuation line\n"
    )
    log = KernelLog(str(path), proc_root(tmp_path, BOOTED), BOOT)
    (record,) = log.read()
    assert record.text.startswith("NVRM: Xid (PCI:0000:9b:00): 13,")
    assert record.timestamp == pytest.approx(after, abs=1)
    assert log.read() == []


def test_journalctl_short_iso_and_rfc3339_syslog_lines(tmp_path):
    path = tmp_path / "journal.txt"
    moment = BOOTED + 120
    iso = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(moment))
    rfc = time.strftime("%Y-%m-%dT%H:%M:%S.123456+00:00", time.gmtime(moment + 1))
    path.write_text(f"{iso} gpu-node-7 kernel: NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-0000-4000-8000-00000000000a\n"
                    f"{rfc} gpu-node-7 kernel: mlx5_core 0000:0c:00.0: port_module:238:(pid 0): Port module event\n")
    records = KernelLog(str(path), proc_root(tmp_path, BOOTED), BOOT).read()
    assert [round(r.timestamp) for r in records] == [moment, moment + 1]
    assert records[1].text.startswith("mlx5_core 0000:0c:00.0:")


def test_dmesg_t_lines(tmp_path):
    path = tmp_path / "dmesg.txt"
    moment = BOOTED + 300
    path.write_text(f"[{_local(moment, '%a %b %d %H:%M:%S %Y')}] NVRM: GPU 0000:c1:00.0: RmInitAdapter failed! "
                    "(0x26:0x56:1474)\n")
    (record,) = KernelLog(str(path), proc_root(tmp_path, BOOTED), BOOT).read()
    assert record.text == "NVRM: GPU 0000:c1:00.0: RmInitAdapter failed! (0x26:0x56:1474)"
    assert record.timestamp == pytest.approx(moment, abs=1)


def test_a_text_log_is_read_on_from_its_offset_and_after_rotation_by_time(tmp_path):
    path = tmp_path / "kern.log"
    line = "{} gpu-node-7 kernel: NVRM: Xid (PCI:0000:9b:00): 13, pid=1, name=a, Graphics Exception\n"
    stamp = lambda moment: time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(moment))  # noqa: E731
    path.write_text(line.format(stamp(BOOTED + 10)))
    log = KernelLog(str(path), proc_root(tmp_path, BOOTED), BOOT)
    assert len(log.read()) == 1
    stored = Cursor.loads(log.cursor.dumps())
    with open(path, "a") as f:
        f.write(line.format(stamp(BOOTED + 20)))
    restarted = KernelLog(str(path), proc_root(tmp_path, BOOTED), BOOT, stored)
    assert [round(r.timestamp) for r in restarted.read()] == [BOOTED + 20]
    # logrotate moves the file away and a new one starts: it is read from its start, after the last time read.
    os.rename(path, tmp_path / "kern.log.1")
    path.write_text(line.format(stamp(BOOTED + 20)) + line.format(stamp(BOOTED + 30)))
    assert [round(r.timestamp) for r in restarted.read()] == [BOOTED + 30]


def test_where_kmsg_cannot_be_opened_the_ring_is_read_through_syslog(tmp_path, monkeypatch):
    # A container runtime refuses an unprivileged container /dev/kmsg whatever is mounted: the same ring
    # is read with syslog(2), which needs CAP_SYSLOG only.
    import ctypes

    if ctypes.CDLL(None, use_errno=True).klogctl(3, ctypes.create_string_buffer(1), 1) < 0:
        pytest.skip("syslog(2) cannot read this machine's ring")
    from gpu_monitoring.node import kernel_log
    from gpu_monitoring.node.boot import read_boot_id

    monkeypatch.setattr(kernel_log, "KMSG", str(tmp_path / "kmsg-refused"))
    log = KernelLog("auto", "/proc", read_boot_id("/proc"))
    first = log.read()
    assert log.problem is None and first and log.cursor.kind == "syslog"
    assert all(a.seq < b.seq for a, b in zip(first, first[1:]))
    assert all(record.seq > first[-1].seq for record in log.read())
    # A restart goes on from the stored cursor, not from the ring's start.
    restarted = KernelLog("auto", "/proc", log.boot_id, Cursor.loads(log.cursor.dumps()))
    assert all(record.seq > first[-1].seq for record in restarted.read())


def test_a_dmesg_t_message_over_several_lines_is_one_record(tmp_path):
    path = tmp_path / "dmesg.txt"
    moment = BOOTED + 300
    stamp = _local(moment, "%a %b %d %H:%M:%S %Y")
    path.write_text(f"[{stamp}] NVRM: The NVIDIA GPU 0000:18:00.0\n"
                    "               NVRM: (PCI ID: 10de:2901) installed in this system has\n"
                    f"[{stamp}] NVRM: fallen off the bus and is not responding to commands.\n")
    records = KernelLog(str(path), proc_root(tmp_path, BOOTED), BOOT).read()
    assert [r.text for r in records] == [
        "NVRM: The NVIDIA GPU 0000:18:00.0\nNVRM: (PCI ID: 10de:2901) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]


def test_epipe_is_counted_and_reading_goes_on_at_the_oldest_record_kept(tmp_path, monkeypatch, caplog):
    """A reader the ring overtook gets EPIPE once, then the oldest record kept (Documentation/ABI/testing/
    dev-kmsg). No machine can be made to overwrite its ring on demand, so the device's answers are played
    back from a script beneath the reader: a character device (here /dev/null) read through os.read."""
    from gpu_monitoring.node import kernel_log

    script = [b"4,7,1000,-;record 7\n", BrokenPipeError(32, "Broken pipe"), b"4,12,2000,-;record 12\n",
              BlockingIOError(11, "Resource temporarily unavailable")]

    def device(fd, size):
        answer = script.pop(0) if script else BlockingIOError(11, "Resource temporarily unavailable")
        if isinstance(answer, OSError):
            raise answer
        return answer

    log = KernelLog("/dev/null", proc_root(tmp_path), BOOT, Cursor(BOOT, 6))
    monkeypatch.setattr(kernel_log.os, "read", device)
    with caplog.at_level(logging.INFO, logger="gpu_monitoring.node.kernel_log"):
        assert [r.seq for r in log.read()] == [7, 12]
        assert log.read() == []
    assert log.lost == 4
    assert sum("overwrote 4 records" in r.getMessage() for r in caplog.records) == 1
