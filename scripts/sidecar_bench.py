"""Benchmark the sidecar on a simulated dgx-h100; prints figures, asserts nothing.

- snapshot latency over the unix socket: p50/p99 of 1,000 requests, one client;
- sidecar memory: RSS at start, after 1,000 and after 10,000 snapshots.
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.sidecar_support import SidecarProcess  # noqa: E402

LATENCY_REQUESTS = 1000
MEMORY_REQUESTS = 10000


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        sidecar = SidecarProcess(Path(tmp), "dgx-h100").start()
        try:
            client = sidecar.client()
            pid = sidecar.process.pid
            client.snapshot()
            print(f"sidecar RSS after start: {rss_mib(pid):.1f} MiB")
            latencies = []
            for _ in range(LATENCY_REQUESTS):
                started = time.perf_counter()
                client.snapshot()
                latencies.append((time.perf_counter() - started) * 1000)
            latencies.sort()
            print(f"snapshot latency over {LATENCY_REQUESTS} requests: p50 {statistics.median(latencies):.1f} ms,"
                  f" p99 {latencies[int(len(latencies) * 0.99) - 1]:.1f} ms, max {latencies[-1]:.1f} ms")
            print(f"sidecar RSS after {LATENCY_REQUESTS + 1} snapshots: {rss_mib(pid):.1f} MiB")
            for _ in range(MEMORY_REQUESTS - LATENCY_REQUESTS - 1):
                client.snapshot()
            print(f"sidecar RSS after {MEMORY_REQUESTS} snapshots: {rss_mib(pid):.1f} MiB")
        finally:
            sidecar.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
