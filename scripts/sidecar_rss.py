"""The sidecar's resident memory as the Agent uses it: a simulated node served for a while, one
snapshot per interval; prints figures, asserts nothing. The sidecar chart's memory request is set
from it (deploy/helm/gpu-monitoring-sidecar/values.yaml).

    python scripts/sidecar_rss.py [--scenario dgx-h100] [--seconds 30] [--interval 5]

With --simulate, the sidecar process also holds the simulated driver, kubelet and pod-resources
server, so the figure is above what it needs on a real node.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar_bench import rss_mib  # noqa: E402

from tests.sidecar_support import SidecarProcess  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="dgx-h100", help="simulated node (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to serve (default %(default)g)")
    parser.add_argument("--interval", type=float, default=5.0,
                        help="seconds between snapshots; the Agent's is 15 (default %(default)g)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sidecar = SidecarProcess(Path(tmp), args.scenario, "--log-level", "ERROR").start()
        try:
            client, pid = sidecar.client(), sidecar.process.pid
            started, peak, snapshots = time.monotonic(), 0.0, 0
            while time.monotonic() - started < args.seconds:
                client.snapshot()
                snapshots += 1
                peak = max(peak, rss_mib(pid))
                time.sleep(args.interval)
            print(f"sidecar --simulate {args.scenario}: RSS {rss_mib(pid):.1f} MiB after "
                  f"{time.monotonic() - started:.0f} s and {snapshots} snapshots, one every {args.interval:g} s "
                  f"(peak {peak:.1f} MiB)")
        finally:
            sidecar.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
