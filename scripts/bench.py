"""Benchmark the check on simulated nodes; prints figures, asserts nothing.

NVML calls per GPU per run (by function), CPU per run (with and without the simulated
driver's own share), series per run on dgx-h100, and how CPU per run scales with GPUs.
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


def measure(simulate: str, runs: int = RUNS) -> dict:
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{"simulate": simulate}])
    sim = check.simulation
    sim.clock.set_speed(0)
    check.run()  # the first run learns capabilities and takes the first GPM samples
    sim.calls.clear()
    sim.cpu_seconds = 0.0
    cpu = 0.0
    series = 0
    for _ in range(runs):
        sim.advance(INTERVAL)
        aggregator.reset()
        started = time.process_time()
        error = check.run()
        cpu += time.process_time() - started
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
    }
    check.cancel()
    return figures


def scaled_scenario(directory: Path, gpus: int) -> str:
    raw = yaml.safe_load(resolve("dgx-h100").read_text())
    template = raw["devices"][:8]
    raw["devices"] = [dict(template[i % 8], pci_bus_id=f"00000000:{i + 1:02X}:00.0") for i in range(gpus)]
    path = directory / f"h100-x{gpus}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def main() -> int:
    result = measure("dgx-h100")
    print(f"dgx-h100: {result['gpus']} GPUs, {RUNS} runs after a warm-up run, {INTERVAL} s apart (simulated)")
    print(f"  NVML calls per GPU per run: {sum(result['calls'].values()):.2f}")
    for name, per_gpu in sorted(result["calls"].items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"    {per_gpu:6.2f}  {name}")
    print(f"  CPU per run: {result['cpu_ms']:.1f} ms (of which the simulated driver {result['driver_ms']:.1f} ms;"
          f" the check itself {result['cpu_ms'] - result['driver_ms']:.1f} ms)")
    print(f"  series per run: {result['series']}")
    print("scaling (H100 nodes of N GPUs): GPUs, CPU ms per run, check-only ms per run, series per run")
    with tempfile.TemporaryDirectory() as tmp:
        for gpus in (1, 2, 4, 8, 16):
            r = measure(scaled_scenario(Path(tmp), gpus), runs=10)
            print(f"  {gpus:3d}  {r['cpu_ms']:8.1f}  {r['cpu_ms'] - r['driver_ms']:8.1f}  {r['series']:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
