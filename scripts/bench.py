"""Benchmark the check on simulated nodes (`make bench`); prints figures and targets, asserts nothing.

    python scripts/bench.py [--runs N] [--scenario NAME ...] [--out DIR] [--json FILE]
    python scripts/bench.py --profile [SCENARIO]
    python scripts/bench.py --dcgm
    python scripts/bench.py --sysfs
    python scripts/bench.py --kernel
    python scripts/bench.py --cgroups

1. NVML calls per GPU per steady-state run, by function;
2. CPU per series against the submission floor, interleaved in one process, and field entries' cost;
   what a DCGM read (dcgm-exporter's page parsed and joined) adds to a run; what reading and judging
   the node around the GPUs (sysfs: PCI functions, InfiniBand/RoCE ports) costs; what reading the
   kernel's log costs (a steady run, a full ring's first read, a storm of XID lines); what telling why a
   held GPU idles costs (the workloads' cgroups, the processes' states, the Slurm jobs' GPUs);
3. a profile of steady-state runs, grouped by whose code each function is;
4. scaling with GPUs, processes, pods and MIG instances; kubelet, pod-resources and /proc reads;
5. memory over many runs in local and sidecar mode;
6. a kubelet refresh on a full node (110 pods, 1.5 MB of /pods over HTTPS).

Writes `PERFORMANCE.md` and `performance.png` into --out (docs/ by default). Exits 0 whatever
the targets say: each is printed PASS or FAIL beside its figure.
"""

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# gRPC's C core logs each pod-resources channel it closes; set before grpc loads, children inherit it.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from bench_support import (  # noqa: E402
    calls,
    cgroup_reads,
    cpu,
    dcgm_read,
    document,
    headline,
    hotspots,
    kernel_reads,
    kubelet_refresh,
    memory_report,
    plot,
    refresh,
    scaling,
    scenarios,
    sysfs_reads,
)
from bench_support.floor import compare  # noqa: E402
from bench_support.harness import quiet_logs  # noqa: E402
from bench_support.memory_modes import measure_modes  # noqa: E402
from bench_support.report import Report, Section, text  # noqa: E402

CROWDED = "dgx-h100, 8 processes/GPU"
EVERYTHING = "dgx-h100, metrics_profile full"
# Every read the check makes, per-process ones included, on GPUs that each list processes.
CROWDED_EVERYTHING = "dgx-h100, 8 processes/GPU, metrics_profile full"
# Blackwell on NVLink 5 with a fabric: what the fabric call and the NVLink 5 fields add to a run.
FABRIC_EVERYTHING = "hgx-b200, metrics_profile full"
FIELD_PROFILE_RUNS = 50
MEMORY_WARM_UP = 100


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS", 2000)),
                        help="check runs for the memory figures, per mode (BENCH_RUNS; default 2,000; "
                        "`make soak` runs 10,000)")
    parser.add_argument("--trace-runs", type=int, default=300,
                        help="of those, runs traced by tracemalloc after the warm-up (default 300)")
    parser.add_argument("--rounds", type=int, default=200, help="interleaved floor/check rounds (default 200)")
    parser.add_argument("--calls-runs", type=int, default=20, help="runs counting NVML calls (default 20)")
    parser.add_argument("--scaling-runs", type=int, default=20, help="runs per scaling point (default 20)")
    parser.add_argument("--max-processes", type=int, default=scaling.PROCESSES[-1],
                        help=f"the largest process count of the sweep (default {scaling.PROCESSES[-1]:,})")
    parser.add_argument("--kube-ttl", type=float, default=1.0,
                        help="pod_cache_ttl while counting kubelet requests over three TTLs (default 1 s)")
    parser.add_argument("--profile-runs", type=int, default=100, help="runs under cProfile (default 100)")
    parser.add_argument("--scenario", action="append", help="a scenario to report on (repeatable; default: "
                        f"{', '.join(scenarios.HEADLINE)} and a field-refusing one if present)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where PERFORMANCE.md and the PNG go")
    parser.add_argument("--json", type=Path, help="also write every figure as JSON")
    parser.add_argument("--profile", nargs="?", const="dgx-h100", metavar="SCENARIO",
                        help="print only the profile of SCENARIO (default dgx-h100)")
    parser.add_argument("--dcgm", action="store_true", help="print only the table of a DCGM read's CPU (section 2's)")
    parser.add_argument("--kernel", action="store_true",
                        help="print only the table of the kernel log's reads' CPU (section 2's)")
    parser.add_argument("--cgroups", action="store_true",
                        help="print only the table of the workload cgroups' and Slurm jobs' reads (section 2's)")
    parser.add_argument("--sysfs", action="store_true",
                        help="print only the table of the node's sysfs reads' CPU (section 2's)")
    args = parser.parse_args(argv)
    args.scenario = args.scenario or scenarios.headline()
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    quiet_logs()
    if args.profile:
        print(text(hotspots.section(args.profile, args.profile_runs, args.rounds)))
        return 0
    if args.dcgm:
        print(text(Section("DCGM read", [dcgm_read.table(args.rounds, Report())])))
        return 0
    if args.sysfs:
        print(text(Section("The node around the GPUs", [sysfs_reads.table(args.rounds, Report())])))
        return 0
    if args.cgroups:
        print(text(Section("Why held GPUs idle", [cgroup_reads.table(args.rounds, Report())])))
        return 0
    if args.kernel:
        print(text(Section("The kernel's log", [kernel_reads.table(args.rounds, Report())])))
        return 0
    started = time.monotonic()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="gpu-monitoring-bench-") as tmp:
        for build in (_calls, _cpu, _profile, _scaling, _memory, _full_node):
            section_started = time.monotonic()
            section = build(args, Path(tmp), report)
            section.notes.append(f"(this section took {time.monotonic() - section_started:.1f} s)")
            report.sections.append(section)
            print(text(section), flush=True)
    print(text(document.targets_section(report)))
    elapsed = time.monotonic() - started
    _write(args, report, elapsed)
    print(f"bench took {elapsed:.0f} s of wall time on {os.cpu_count()} cores ({document.cpu_model()})")
    return 0


def _calls(args: argparse.Namespace, directory: Path, report: Report) -> Section:
    counts = [calls.count_calls(name, name, args.calls_runs) for name in args.scenario]
    crowded = scenarios.crowded(directory, 8, 64, 64)
    counts.append(calls.count_calls(CROWDED, crowded, args.calls_runs))
    # The default profile leaves out reads that give only metrics it does not send; `full` makes them all.
    counts.append(calls.count_calls(EVERYTHING, "dgx-h100", args.calls_runs, metrics_profile="full"))
    counts.append(calls.count_calls(CROWDED_EVERYTHING, crowded, args.calls_runs, metrics_profile="full"))
    counts.append(calls.count_calls(FABRIC_EVERYTHING, "hgx-b200", args.calls_runs, metrics_profile="full"))
    targeted = {"dgx-h100", CROWDED, EVERYTHING, CROWDED_EVERYTHING, scenarios.FIELD_REFUSING, "hgx-b200",
                FABRIC_EVERYTHING}
    return calls.section(counts, args.calls_runs, report, targeted, fallbacks_apart={scenarios.FIELD_REFUSING})


def _cpu(args: argparse.Namespace, _directory: Path, report: Report) -> Section:
    comparisons = [(name, compare(name, args.rounds)) for name in args.scenario]
    comparisons.append((EVERYTHING, compare("dgx-h100", args.rounds, metrics_profile="full")))
    name, headline = next(((n, c) for n, c in comparisons if n == "dgx-h100"), comparisons[0])
    fields = cpu.field_cost(name, min(FIELD_PROFILE_RUNS, args.profile_runs), headline.own_ms)
    section = cpu.section(comparisons, (name, fields), report, targeted=EVERYTHING)
    section.tables.append(refresh.table(name, refresh.measure(headline, name, args.rounds)))
    section.tables.append(dcgm_read.table(args.rounds, report))
    section.tables.append(sysfs_reads.table(args.rounds, report))
    section.tables.append(kernel_reads.table(args.rounds, report))
    section.tables.append(cgroup_reads.table(args.rounds, report))
    return section


def _profile(args: argparse.Namespace, _directory: Path, _report: Report) -> Section:
    return hotspots.section("dgx-h100", args.profile_runs, args.rounds)


def _scaling(args: argparse.Namespace, directory: Path, report: Report) -> Section:
    return scaling.section(directory, args.scaling_runs, report, args.max_processes, args.kube_ttl)


def _memory(args: argparse.Namespace, _directory: Path, report: Report) -> Section:
    warm_up = min(MEMORY_WARM_UP, max(args.runs // 10, 1))
    return memory_report.section(measure_modes(args.runs, args.trace_runs, warm_up), report)


def _full_node(_args: argparse.Namespace, _directory: Path, report: Report) -> Section:
    return Section("6. A full node's kubelet", [kubelet_refresh.table(report)])


def _write(args: argparse.Namespace, report: Report, elapsed: float) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["scripts/bench.py"] + [shlex.quote(a) for a in sys.argv[1:]])
    document.write(report, args.out / "PERFORMANCE.md", command, elapsed)
    problem = plot.write(report.curves, args.out / "performance.png")
    print(f"wrote {args.out / 'PERFORMANCE.md'}" + (f"; no plot: {problem}" if problem else
                                                   f" and {args.out / 'performance.png'}"))
    machine = f"{os.cpu_count()}-core {document.cpu_model()}, Python {platform.python_version()}"
    # Only a run into the project's own docs speaks for the README.
    readme = ROOT / "README.md" if args.out == ROOT / "docs" else None
    headline.write(headline.figures(report, elapsed, machine), args.out / "performance.json", readme)
    print(f"wrote {args.out / 'performance.json'}" + (" and README.md's figures" if readme else ""))
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=1))


if __name__ == "__main__":
    sys.exit(main())
