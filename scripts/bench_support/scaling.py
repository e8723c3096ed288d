"""Section 4: how CPU per run grows with GPUs, processes, pods and MIG instances, and what the
check asks of the kubelet, pod-resources and the proc root per run."""

from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

from . import scenarios
from .harness import Costs, per
from .kube_requests import count_requests
from .proc_reads import count_reads
from .report import Report, Section, Table
from .sweep import measure_all

GPUS = (1, 2, 4, 8, 16)
PROCESSES = (1, 10, 100, 500, 2000)
PODS = (10, 40, 110)
SCALING_LIMIT = 2.1  # CPU per run at 16 GPUs over 8
PODS_PER_GPU_PROCESSES = 10  # pods sharing the one GPU of the processes' node
KUBE_TTLS = 3  # TTL windows the check runs through


def section(directory: Path, runs: int, report: Report, max_processes: int, kube_ttl: float) -> Section:
    tables = [
        _gpus(directory, runs, report),
        _processes(directory, runs, report, [n for n in PROCESSES if n <= max_processes]),
        _pods(directory, runs, report),
        _mig(directory, runs, report),
        _requests(report, kube_ttl),
        _proc_reads(directory, runs, report),
    ]
    return Section(f"4. Scaling (median CPU per run over {runs} steady runs, ms of the check's thread)", tables,
                   ["`own` leaves out the simulated driver's CPU, as in section 2"])


def _sweep(report: Report, panel: str, sizes: Sequence[int], build: Callable[[int], str], runs: int,
           **options: object) -> List[Tuple[int, Costs]]:
    measured = list(zip(sizes, measure_all([build(size) for size in sizes], runs, **options)))
    report.curves[panel] = {
        "x": [size for size, _ in measured],
        "total": [c.cpu_ms for _, c in measured],
        "own": [c.own_ms for _, c in measured],
    }
    return measured


def _gpus(directory: Path, runs: int, report: Report) -> Table:
    measured = _sweep(report, "GPUs", GPUS, lambda n: scenarios.scaled(directory, n), runs)
    table = Table("H100 nodes of N GPUs, no Kubernetes", ["GPUs", "ms/run", "own ms/run", "own ms/GPU", "series"],
                  [[n, c.cpu_ms, c.own_ms, c.own_ms / n, c.series] for n, c in measured])
    costs: Dict[int, Costs] = dict(measured)
    if 8 in costs and 16 in costs:
        ratio = per(costs[16].own_ms, costs[8].own_ms)
        verdict = report.target("own CPU per run, 16 GPUs over 8", ratio, f"<= {SCALING_LIMIT}", ratio <= SCALING_LIMIT)
        table.notes.append(f"16 GPUs / 8 GPUs, own CPU: {ratio:.2f} (target <= {SCALING_LIMIT}: {verdict}); "
                           f"with the driver: {per(costs[16].cpu_ms, costs[8].cpu_ms):.2f}")
    return table


def _processes(directory: Path, runs: int, report: Report, sizes: Sequence[int]) -> Table:
    def build(n: int) -> str:
        return scenarios.crowded(directory, 1, n, min(n, PODS_PER_GPU_PROCESSES))

    measured = _sweep(report, "processes", sizes, build, runs)
    return Table(f"One time-sliced H100, N processes in up to {PODS_PER_GPU_PROCESSES} pods",
                 ["processes", "ms/run", "own ms/run", "own µs/process", "own µs per added process", "series"],
                 [[n, c.cpu_ms, c.own_ms, c.own_ms * 1000 / n, _marginal_us(measured, n, c), c.series]
                  for n, c in measured],
                 ["added: over the smallest point of the sweep, (own(N) - own(N0)) / (N - N0)"])


def _pods(directory: Path, runs: int, report: Report) -> Table:
    def build(n: int) -> str:
        return scenarios.crowded(directory, 8, n, n)

    measured = _sweep(report, "pods", PODS, build, runs)
    uncached = measure_all([build(n) for n in PODS], runs, pod_cache_ttl=0)
    return Table("8 time-sliced H100s, N pods of one process each, one replica each",
                 ["pods", "ms/run", "own ms/run", "own µs/pod", "own µs per added pod", "own ms/run, pod_cache_ttl 0",
                  "series"],
                 [[n, c.cpu_ms, c.own_ms, c.own_ms * 1000 / n, _marginal_us(measured, n, c), u.own_ms, c.series]
                  for (n, c), u in zip(measured, uncached)],
                 ["runs follow each other at once, within the pod cache's TTL: with TTL 0 each run asks the kubelet"])


def _marginal_us(measured: List[Tuple[int, Costs]], n: int, costs: Costs) -> float:
    """Own µs per unit added since the sweep's first point (0 at that point)."""
    first, base = measured[0]
    return per((costs.own_ms - base.own_ms) * 1000, n - first)


def _mig(directory: Path, runs: int, report: Report) -> Table:
    measured = _sweep(report, "MIG instances", (7, 56), lambda n: scenarios.mig(directory, n // 7), runs)
    small, large = measured[0][1], measured[1][1]
    return Table("A100s in seven 1g.10gb instances each, no Kubernetes",
                 ["instances", "GPUs", "ms/run", "own ms/run", "own µs/instance"],
                 [[n, n // 7, c.cpu_ms, c.own_ms, c.own_ms * 1000 / n] for n, c in measured],
                 [f"own CPU per instance, 8x7 over 1x7: {per(large.own_ms * 7, small.own_ms * 56):.2f}"])


def _requests(report: Report, ttl: float) -> Table:
    r = count_requests("dgx-h100", ttl, ttl * KUBE_TTLS)
    kubelet = report.target("kubelet requests per pod_cache_ttl", r.kubelet_per_ttl, "<= 1", r.kubelet_per_ttl <= 1)
    resources = report.target("pod-resources calls per run", r.pod_resources_per_run, "<= 1",
                              r.pod_resources_per_run <= 1)
    return Table(
        f"Kubernetes requests (dgx-h100, pod_cache_ttl {ttl:g} s, {r.runs} runs back to back in {r.elapsed:.1f} s)",
        ["figure", "count", "per", "target", "verdict"],
        [["kubelet /pods requests", r.kubelet, f"{r.kubelet_per_ttl:.2f} per TTL ({r.windows} TTLs)", "<= 1", kubelet],
         ["pod-resources calls (List + GetAllocatableResources)", r.pod_resources,
          f"{r.pod_resources_per_run:.3f} per run, {r.pod_resources_per_ttl:.2f} per TTL", "<= 1", resources]],
    )


def _proc_reads(directory: Path, runs: int, report: Report) -> Table:
    scenario = scenarios.crowded(directory, 8, 64, 64)
    r = count_reads(scenario, runs)
    verdict = report.target("/proc reads per run for processes seen before", r.steady_per_run, "0",
                            r.steady_per_run == 0)
    files = sorted(set(r.first_run) | set(r.steady))
    steady = {name: per(count, r.steady_runs) for name, count in r.steady.items()}
    return Table(
        f"/proc reads per run: 8 time-sliced H100s, {r.processes} processes in 64 pods",
        ["run", "reads", "reads/process"] + files + ["target", "verdict"],
        [["first (every process new)", sum(r.first_run.values()), r.per_new_process]
         + [r.first_run.get(name, 0) for name in files] + ["", ""],
         [f"steady (all seen before), mean of {r.steady_runs}", r.steady_per_run, per(r.steady_per_run, r.processes)]
         + [steady.get(name, 0.0) for name in files] + ["0", verdict]],
        ["opens under `<proc_root>/<pid>/`, counted by an audit hook in a child process"],
    )
