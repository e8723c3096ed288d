"""Soak: thousands of check runs while faults cycle, in local and sidecar mode.

    python scripts/soak.py [--runs 10000] [--mode local|sidecar|both]

The node is the `faults` scenario's six H100s with a generated timeline that repeats for the
whole soak: XIDs of every kind (79 takes its GPU off the bus for a while), uncorrectable ECC
errors, thermal slowdown, NVLink and PCIe faults, and a driver reload every 1,000 runs.

- Local mode moves scenario time one 15 s interval per run, so every XID of the timeline is due
  at a known run: the XIDs counted (`xid_errors`, and those the events count: one event per GPU,
  code and run, its count in its title) must equal the timeline's.
- Sidecar mode runs a real sidecar subprocess at high speed and, every 1,000 runs, kills it
  (SIGKILL) and starts it again on the same journal, once after tearing the journal's tail as a
  crash mid-write would. XIDs raised while no sidecar runs are never seen, as on a real node, so
  the promise checked is the journal's: every event it holds is counted exactly once.

Both print escaped exceptions (must be 0), XIDs expected and counted, and this process's RSS after
warm-up and at the end (the check's; in local mode the simulated node's too, while the sidecar is a
process of its own), with the tracemalloc top allocations growth.
"""

import argparse
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Dict, List

import yaml
from datadog_checks.base.stubs import aggregator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_monitoring.check import GpuMonitoringCheck  # noqa: E402
from gpu_monitoring.sidecar.client import SidecarClient, SidecarUnavailable  # noqa: E402

INTERVAL = 15
RESTART_EVERY = 1000
XID_EVERY = 23  # runs between XIDs: a prime, so codes and GPUs meet in every combination
CODES = [13, 31, 43, 48, 63, 74, 79, 94, 119]
WARM_UP = 200
COUNT = re.compile(r"^XID \d+ × ([\d,]+) ")


def timeline(runs: int, devices: int) -> List[dict]:
    """Faults due at known runs. No XID falls within two runs of a driver reload, when NVML is
    being started again and a real driver would lose it too."""
    events = []
    for run in range(XID_EVERY, runs, XID_EVERY):
        if run % RESTART_EVERY in (0, 1, 2, RESTART_EVERY - 1, RESTART_EVERY - 2):
            continue
        code = CODES[(run // XID_EVERY) % len(CODES)]
        event = {"at": run * INTERVAL + 1, "kind": "xid", "device": run % devices, "xid": code}
        if code == 79:
            event["lost_for"] = 4 * INTERVAL
        events.append(event)
    for run in range(RESTART_EVERY, runs, RESTART_EVERY):
        events.append({"at": run * INTERVAL + 1, "kind": "driver_reload"})
    for run in range(97, runs, 211):
        events.append({"at": run * INTERVAL + 1, "kind": "ecc_dbe", "device": run % devices, "count": 1})
        events.append({"at": run * INTERVAL + 1, "kind": "thermal_slowdown", "device": (run + 1) % devices,
                       "duration": 3 * INTERVAL})
    return sorted(events, key=lambda e: e["at"])


def scenario(runs: int, directory: Path) -> Path:
    base = yaml.safe_load((ROOT / "gpu_monitoring" / "simulator" / "scenarios" / "faults.yaml").read_text())
    base["description"] = f"soak: the faults node with its faults repeating over {runs} runs"
    base["faults"] = timeline(runs, len(base["devices"]))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "soak.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def xids_counted() -> int:
    return int(sum(stub.value for stub in aggregator.metrics("gpu_monitoring.xid_errors")))


def xids_in(title: str) -> int:
    """The XIDs an event stands for: the count its title gives ("XID 13 × 3,000 on GPU 0"), else one."""
    found = COUNT.search(title)
    return int(found.group(1).replace(",", "")) if found else 1


class Soak:
    def __init__(self, check: GpuMonitoringCheck):
        self.check = check
        self.escaped: List[str] = []
        self.xids = self.events = 0
        self.rss: Dict[str, float] = {}
        self.snapshot = None

    def run(self) -> None:
        aggregator.reset()
        error = self.check.run()
        if error:
            self.escaped.append(error.splitlines()[0])
        self.xids += xids_counted()
        self.events += sum(xids_in(event["msg_title"]) for event in aggregator.events)

    def mark(self, name: str) -> None:
        self.rss[name] = rss_mib()
        if name == "warm":
            tracemalloc.start()
            self.snapshot = tracemalloc.take_snapshot()

    def report(self, title: str, expected: int) -> bool:
        growth = tracemalloc.take_snapshot().compare_to(self.snapshot, "lineno")[:3] if self.snapshot else []
        tracemalloc.stop()
        ok = not self.escaped and self.xids == expected == self.events
        print(f"{title}: escaped exceptions {len(self.escaped)}; XIDs expected {expected}, counted {self.xids}, "
              f"events {self.events}; this process's RSS {self.rss['warm']:.1f} MiB after {WARM_UP} runs, "
              f"{self.rss['end']:.1f} MiB at the end -> {'ok' if ok else 'FAILED'}")
        for line in self.escaped[:5]:
            print(f"  escaped: {line}")
        for stat in growth:
            print(f"  tracemalloc growth: {stat}")
        return ok


def soak_local(runs: int, directory: Path) -> bool:
    path = scenario(runs, directory)
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{"simulate": str(path), "kubernetes": False}])
    check.simulated_node.nvml.clock.set_speed(0)
    soak = Soak(check)
    for run in range(runs):
        if run:
            check.simulated_node.nvml.advance(INTERVAL)
        soak.run()
        if run == WARM_UP:
            soak.mark("warm")
    soak.mark("end")
    expected = sum(1 for e in yaml.safe_load(path.read_text())["faults"]
                   if e["kind"] == "xid" and e["at"] <= (runs - 1) * INTERVAL)
    check.cancel()
    return soak.report(f"local mode, {runs} runs", expected)


class SidecarProcess:
    def __init__(self, directory: Path, scenario_path: Path, speed: float):
        self.socket = str(directory / "sidecar.sock")
        self.journal = directory / "journal"
        self.args = [sys.executable, "-m", "gpu_monitoring.cli", "sidecar", "--simulate", str(scenario_path),
                     "--socket", self.socket, "--journal", str(self.journal), "--journal-wait", "5",
                     "--log-level", "ERROR"]
        self.speed = speed
        self.process = None

    def start(self, at: float) -> None:
        timing = ["--speed", str(self.speed), "--start-at", str(at)]
        self.process = subprocess.Popen([*self.args, *timing], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                SidecarClient(self.socket, timeout=2).get("/healthz")
                return
            except SidecarUnavailable:
                time.sleep(0.05)
        raise RuntimeError("the sidecar did not start")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def tear_tail(self) -> None:
        """What a crash in the middle of an append leaves: half a record at the end of the newest segment."""
        newest = sorted(self.journal.glob("events-*.log"))[-1]
        with open(newest, "ab") as f:
            f.write(b'{"seq": 999999, "kind": "xid", "co')

    def journaled_xids(self) -> int:
        """The XIDs the journal holds (it holds ECC events too, which are no XIDs)."""
        client, after, total = SidecarClient(self.socket, timeout=10), 0, 0
        while True:
            page = client.events(after, 1000)
            total += sum(1 for event in page.events if event.kind == "xid")
            if page.last_seq == after:
                return total
            after = page.last_seq


def soak_sidecar(runs: int, directory: Path) -> bool:
    # Scenario time runs at `speed`; started again after a kill, the sidecar goes on from where it was.
    speed = 600.0
    path = scenario(runs, directory)
    sidecar = SidecarProcess(directory, path, speed)
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{"source": "sidecar", "sidecar_socket": sidecar.socket,
                                                        "kubernetes": False}])
    soak, at, started = Soak(check), 0.0, time.monotonic()
    sidecar.start(at)
    for run in range(runs):
        if run and run % RESTART_EVERY == 0:
            at += (time.monotonic() - started) * speed
            sidecar.kill()
            if run == 5 * RESTART_EVERY:
                sidecar.tear_tail()
            sidecar.start(at)
            started = time.monotonic()
        soak.run()
        if run == WARM_UP:
            soak.mark("warm")
    # A last run on a sidecar whose scenario time stands still: it reads what the journal holds.
    sidecar.kill()
    sidecar.speed = 0.0
    sidecar.start(at + (time.monotonic() - started) * speed)
    soak.run()
    soak.mark("end")
    expected = sidecar.journaled_xids()
    sidecar.kill()
    return soak.report(f"sidecar mode, {runs} runs, {runs // RESTART_EVERY} kill -9 restarts, one torn tail", expected)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--mode", choices=["local", "sidecar", "both"], default="both")
    args = parser.parse_args(argv)
    # Faults are the point here; their log lines are tested elsewhere.
    logging.basicConfig(level=logging.CRITICAL)
    ok = True
    with tempfile.TemporaryDirectory(prefix="gpu-monitoring-soak-") as tmp:
        if args.mode in ("local", "both"):
            ok &= soak_local(args.runs, Path(tmp) / "local")
        if args.mode in ("sidecar", "both"):
            ok &= soak_sidecar(args.runs, Path(tmp) / "sidecar")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
