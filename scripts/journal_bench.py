"""Benchmark the sidecar's event journal; prints figures, asserts nothing.

- Appends (each fsync'd) for 2 s or 5,000 appends, whichever comes first: events per second and
  latency; then reading them all back in pages.
- A full journal (64 MiB, 16 segments of 4 MiB): time to open it (recovery scans the newest
  segment), reads of a few hundred records from a recent cursor, from the oldest records, and
  a scan of everything. It is written directly in the on-disk format, since filling 64 MiB
  through fsync'd appends would take minutes.
"""

import json
import os
import statistics
import sys
import tempfile
import time
import zlib

from gpu_monitoring.sidecar.journal import Journal

APPEND_SECONDS = 2.0
APPEND_MAX = 5000
SEGMENT_BYTES = 4 * 1024 * 1024
MAX_BYTES = 64 * 1024 * 1024
PAGE = 500


def event(n: int) -> dict:
    return {
        "device_uuid": f"GPU-{n % 8:08x}-1c2d-3e4f-5a6b-7c8d9e0f1a2b",
        "kind": "xid",
        "code": 79,
        "timestamp": 1_700_000_000_000_000 + n,
        "gpu_instance_id": None,
        "compute_instance_id": None,
    }


def bench_appends(directory: str) -> None:
    latencies = []
    with Journal(directory) as journal:
        deadline = time.perf_counter() + APPEND_SECONDS
        while len(latencies) < APPEND_MAX and time.perf_counter() < deadline:
            began = time.perf_counter()
            journal.append(event(len(latencies)))
            latencies.append(time.perf_counter() - began)
        total = sum(latencies)
        print(f"appends (fsync each): {len(latencies)} in {total:.2f} s = {len(latencies) / total:,.0f} events/s; "
              f"latency mean {statistics.mean(latencies) * 1e6:.0f} us, "
              f"p99 {sorted(latencies)[int(len(latencies) * 0.99)] * 1e6:.0f} us")
        count, seconds = read_all(journal)
        print(f"read back in pages of {PAGE}: {count} records in {seconds * 1e3:.1f} ms "
              f"= {count / seconds:,.0f} records/s")


def read_all(journal: Journal):
    began, cursor, count = time.perf_counter(), 0, 0
    while True:
        page = journal.read(cursor, PAGE)
        if not page.records:
            return count, time.perf_counter() - began
        count += len(page.records)
        cursor = page.records[-1]["seq"]


def write_full_journal(directory: str) -> int:
    """Segments as the journal lays them out: 15 full ones and a nearly full newest one."""
    seq = 0
    for _ in range(MAX_BYTES // SEGMENT_BYTES):
        lines, size, first = [], 0, seq + 1
        while True:
            body = json.dumps({"seq": seq + 1, **event(seq + 1)}, separators=(",", ":")).encode()
            line = b"%08x %s\n" % (zlib.crc32(body), body)
            if size + len(line) > SEGMENT_BYTES:
                break
            lines.append(line)
            size += len(line)
            seq += 1
        with open(os.path.join(directory, f"events-{first:020d}.log"), "wb") as f:
            f.write(b"".join(lines))
    return seq


def timed(call, repeat: int) -> float:
    """Median seconds of a call."""
    runs = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        runs.append(time.perf_counter() - began)
    return statistics.median(runs)


def bench_full_journal(directory: str) -> None:
    last = write_full_journal(directory)
    size = sum(os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory))
    print(f"full journal: {size / 2**20:.1f} MiB, {len(os.listdir(directory))} segments, {last:,} records")
    began = time.perf_counter()
    journal = Journal(directory)
    print(f"  open (recovers the newest segment): {(time.perf_counter() - began) * 1e3:.1f} ms")
    with journal:
        recent = timed(lambda: journal.read(last - 300, 300), 50)
        print(f"  read 300 records from a recent cursor: {recent * 1e3:.2f} ms")
        began = time.perf_counter()
        journal.read(0, 300)
        print(f"  read 300 records from the oldest, first time (indexes that segment): "
              f"{(time.perf_counter() - began) * 1e3:.2f} ms")
        oldest = timed(lambda: journal.read(0, 300), 50)
        print(f"  read 300 records from the oldest, indexed: {oldest * 1e3:.2f} ms")
        middle = timed(lambda: journal.read(last // 2, 300), 50)
        print(f"  read 300 records from the middle: {middle * 1e3:.2f} ms")
        count, seconds = read_all(journal)
        print(f"  scan everything in pages of {PAGE}: {count:,} records in {seconds:.2f} s "
              f"= {count / seconds:,.0f} records/s")


def main() -> int:
    with tempfile.TemporaryDirectory() as appends, tempfile.TemporaryDirectory() as full:
        print(f"journal directories on {os.path.dirname(appends)}")
        bench_appends(appends)
        bench_full_journal(full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
