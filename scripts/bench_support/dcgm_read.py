"""What a DCGM read adds to a run's CPU: one dcgm-exporter page of an 8-GPU node parsed and joined
to the snapshot (the HTTP exchange itself is a kept-alive request like the kubelet's). The pages
are recorded ones of 8 A100s as dcgm-exporter 4.x prints them with all its default counters (some
thirty lines a GPU, of which the profiling lines are parsed), and with the profiling fields its
default CSV leaves off turned on."""

import re
import statistics
import time
from pathlib import Path
from typing import List

from gpu_monitoring.dcgm.exposition import METRICS, Known, parse
from gpu_monitoring.dcgm.freshness import Freshness
from gpu_monitoring.dcgm.join import LINK_METRICS, join, wanted
from gpu_monitoring.snapshot import Device, Node, Snapshot

from .report import Report, Table

PAGES = Path(__file__).resolve().parents[2] / "tests" / "data" / "dcgm"
DEFAULT_PAGE = "a100-8gpu-default-4.x.txt"
FULL_PAGE = "a100-8gpu-4.x.txt"
READS = 200
LIMIT_MS = 2.0


def _snapshot(body: bytes, nvml_throughput: bool) -> Snapshot:
    """The node the page is of: its 8 GPUs, with NVML's PCIe and NVLink throughput or without."""
    uuids = dict.fromkeys(re.findall(r'UUID="(GPU-[^"]+)"', body.decode()))
    metrics = dict.fromkeys(LINK_METRICS, 1.0) if nvml_throughput else {}
    return Snapshot(0.0, Node(), [Device(index=i, uuid=u, metrics=dict(metrics)) for i, u in enumerate(uuids)])


def measure(name: str, nvml_throughput: bool, rounds: int) -> float:
    """ms of CPU per steady read (parse, freshness, join; the exporter's series known from the reads
    before, as the reader keeps them), the median of `rounds` rounds of READS reads."""
    body = (PAGES / name).read_bytes()
    freshness = Freshness()
    known: Known = {}
    parse(body, METRICS, known)
    per_round: List[float] = []
    for _ in range(max(rounds, 1)):
        snapshots = [_snapshot(body, nvml_throughput) for _ in range(READS)]
        started = time.process_time()
        for snapshot in snapshots:
            samples, _stale = freshness.fresh(parse(body, wanted(snapshot), known))
            join(snapshot, samples)
        per_round.append((time.process_time() - started) * 1000 / READS)
    return statistics.median(per_round)


def table(rounds: int, report: Report) -> Table:
    usual = measure(DEFAULT_PAGE, True, rounds)
    rows = [
        ["8x A100, default counters; NVML gives PCIe and NVLink throughput", usual,
         report.target("CPU a DCGM read adds per run, 8 GPUs, default counters", usual,
                       f"< {LIMIT_MS:g} ms", usual < LIMIT_MS)],
        ["8x A100, default counters; no NVML throughput (DCGM's PCIe bytes parsed too)",
         measure(DEFAULT_PAGE, False, rounds), ""],
        ["8x A100, default counters + SM active/occupancy, FP pipes, NVLink bytes", measure(FULL_PAGE, True, rounds),
         ""],
    ]
    return Table(
        "A DCGM read (dcgm-exporter page parsed, judged fresh, joined to the snapshot)",
        ["page", "CPU ms per read", "verdict"],
        rows,
        ["a steady read: only the lines of the DCGM_FI_PROF_* fields a GPU lacks are kept; prometheus_client's "
         "parser reads each series the first time the exporter sends it, later reads only its value; the "
         "heartbeat lines are compared as text; comments and every other field are skipped by name. "
         "The HTTP request is not in this figure: section 2's a100-mig and t4-shared runs include it"],
    )
