"""The sidecar's resident memory on a simulated node against its target: RSS after a number of
snapshots, asked back to back (the Agent asks for one every 15 s). Exit status 1 when it is over.

    .venv/bin/python scripts/sidecar_rss.py [--snapshots 2000] [--scenario dgx-h100] [--target 60]

With --simulate, the sidecar process also holds the simulated driver and the simulated node's servers
(pod-resources, and a kubelet the sidecar never reads), so the figure is above what it needs on a real
node. The sidecar chart's memory request is set from `make bench`'s figure
(deploy/helm/gpu-monitoring-sidecar/values.yaml).
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar_bench import rss_mib  # noqa: E402

from tests.sidecar_support import SidecarProcess  # noqa: E402

TARGET_MIB = 60.0
SNAPSHOTS = 2000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="dgx-h100", help="simulated node (default %(default)s)")
    parser.add_argument("--snapshots", type=int, default=SNAPSHOTS, help="snapshots to ask for (default %(default)s)")
    parser.add_argument("--target", type=float, default=TARGET_MIB, metavar="MIB",
                        help="the most RSS the sidecar may have after them (default %(default)g MiB)")
    args = parser.parse_args()
    if args.snapshots < 1:
        parser.error("--snapshots must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        sidecar = SidecarProcess(Path(tmp), args.scenario, "--log-level", "ERROR").start()
        try:
            client, pid = sidecar.client(), sidecar.process.pid
            client.snapshot()
            first = peak = rss_mib(pid)
            for _ in range(args.snapshots - 1):
                client.snapshot()
                peak = max(peak, rss_mib(pid))
            last = rss_mib(pid)
        finally:
            sidecar.stop()
    met = last <= args.target
    print(f"sidecar --simulate {args.scenario}: RSS {last:.1f} MiB after {args.snapshots} snapshots "
          f"({first:.1f} MiB after the first, peak {peak:.1f} MiB)")
    print(f"target: RSS <= {args.target:g} MiB after {args.snapshots} snapshots: {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
