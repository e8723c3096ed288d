"""Benchmark the check on simulated nodes; prints figures, asserts nothing.

- dgx-h100: NVML calls per GPU per run (by function), CPU per run (with and without the
  simulated driver's own share), series per run.
- Scaling of CPU per run with the number of GPUs.
- Attribution at scale: 8 GPUs, 64 processes, 40 pods sharing them; kubelet and
  pod-resources requests per run and CPU per run.

CPU is the check thread's own (time.thread_time): the in-process kubelet and gRPC servers
run on other threads and are not counted.
"""

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml
from datadog_checks.base.stubs import aggregator

from gpu_monitoring import GpuMonitoringCheck
from gpu_monitoring.simulator.scenario import resolve

RUNS = 20
INTERVAL = 15


def measure(simulate: str, runs: int = RUNS, **options) -> dict:
    check = GpuMonitoringCheck("gpu_monitoring", {}, [dict(options, simulate=simulate)])
    sim = check.simulation
    sim.clock.set_speed(0)
    check.run()  # the first run learns capabilities and takes the first GPM samples
    sim.calls.clear()
    sim.cpu_seconds = 0.0
    node = check.simulated_node if check.simulated_node and check.simulated_node.kubelet else None
    cpu = 0.0
    series = 0
    for _ in range(runs):
        sim.advance(INTERVAL)
        aggregator.reset()
        started = time.thread_time()
        error = check.run()
        cpu += time.thread_time() - started
        if error:
            raise SystemExit(f"check failed: {error}")
        series = len({(m.name, tuple(sorted(m.tags))) for n in aggregator.metric_names for m in aggregator.metrics(n)})
    gpus = len(sim.devices)
    figures = {
        "gpus": gpus,
        "calls": Counter({k: v / runs / gpus for k, v in sim.calls.items()}),
        "cpu_ms": cpu / runs * 1000,
        "driver_ms": sim.cpu_seconds / runs * 1000,
        "series": series,
        # Over every run, the warm-up one included.
        "kubelet_requests": node.kubelet.requests if node else 0,
        "pod_resources_requests": node.pod_resources.requests if node else 0,
        "runs": runs + 1,
    }
    check.cancel()
    return figures


def scaled_scenario(directory: Path, gpus: int) -> str:
    raw = yaml.safe_load(resolve("dgx-h100").read_text())
    template = raw["devices"][:8]
    raw["devices"] = [dict(template[i % 8], pci_bus_id=f"00000000:{i + 1:02X}:00.0") for i in range(gpus)]
    raw.pop("kubernetes")
    path = directory / f"h100-x{gpus}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def crowded_scenario(directory: Path, gpus: int = 8, processes: int = 64, pods: int = 40) -> str:
    """Time-sliced H100s: `pods` pods hold one replica each, running `processes` processes."""
    raw = yaml.safe_load(resolve("dgx-h100").read_text())
    base = raw["devices"][0]
    pod_procs = {p: [] for p in range(pods)}
    for n in range(processes):
        pod_procs[n % pods].append(10000 + n)
    devices = [dict(base, pci_bus_id=f"00000000:{i + 1:02X}:00.0", processes=[]) for i in range(gpus)]
    for pod, pids in pod_procs.items():
        devices[pod % gpus]["processes"] += [{"pid": pid, "name": "python3", "memory_mib": 900} for pid in pids]
    raw["devices"] = devices
    raw["kubernetes"] = {"pods": [
        {"name": f"worker-{pod}", "namespace": f"team-{pod % 5}", "containers": [{
            "name": "main", "resource": "nvidia.com/gpu.shared",
            "devices": [f"gpu:{pod % gpus}::{pod // gpus}"], "processes": pids,
        }]}
        for pod, pids in pod_procs.items()
    ]}
    path = directory / "crowded.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def requests(figures: dict) -> str:
    return (f"kubelet requests: {figures['kubelet_requests']} over {figures['runs']} runs;"
            f" pod-resources requests: {figures['pod_resources_requests']} over {figures['runs']} runs")


def main() -> int:
    result = measure("dgx-h100")
    print(f"dgx-h100: {result['gpus']} GPUs, 6 pods, {RUNS} runs after a warm-up run, {INTERVAL} s apart (simulated)")
    print(f"  NVML calls per GPU per run: {sum(result['calls'].values()):.2f}")
    for name, per_gpu in sorted(result["calls"].items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"    {per_gpu:6.2f}  {name}")
    print(f"  CPU per run: {result['cpu_ms']:.1f} ms (of which the simulated driver {result['driver_ms']:.1f} ms;"
          f" the check itself {result['cpu_ms'] - result['driver_ms']:.1f} ms)")
    print(f"  series per run: {result['series']}")
    print(f"  {requests(result)} (pod_cache_ttl 30 s)")
    with tempfile.TemporaryDirectory() as tmp:
        print("scaling (H100 nodes of N GPUs, no Kubernetes): GPUs, CPU ms per run, check-only ms per run, series")
        for gpus in (1, 2, 4, 8, 16):
            r = measure(scaled_scenario(Path(tmp), gpus), runs=10)
            print(f"  {gpus:3d}  {r['cpu_ms']:8.1f}  {r['cpu_ms'] - r['driver_ms']:8.1f}  {r['series']:6d}")
        crowded = crowded_scenario(Path(tmp))
        print("attribution at scale: 8 time-sliced H100s, 64 processes, 40 pods")
        for ttl in (30, 0):
            r = measure(crowded, runs=10, pod_cache_ttl=ttl)
            print(f"  pod_cache_ttl {ttl:2d} s: CPU per run {r['cpu_ms']:.1f} ms (check itself"
                  f" {r['cpu_ms'] - r['driver_ms']:.1f} ms); series per run {r['series']}; {requests(r)}")
        print("  (runs here follow each other at once: with a TTL of 30 s and runs 15 s apart, one kubelet")
        print("   request serves two runs; with TTL 0 every run asks the kubelet)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
