"""What a DCGM read adds to a run's CPU on an 8-GPU node: the whole read (the GET over loopback to the
simulated dcgm-exporter, on the reader's kept-alive connection, its page parsed, judged fresh and
joined to the snapshot), and parsing and joining alone. The whole read's exporter serves the
simulated 8x A100 node of `hpc-slurm` with all of dcgm-exporter's default counters; the pages parsed
alone are recorded ones of 8 A100s as dcgm-exporter 4.x prints them with its default counters (some
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
from gpu_monitoring.dcgm.reader import DcgmReader
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.dcgm_exporter_server import DcgmExporterServer
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import DcgmExporterSpec
from gpu_monitoring.simulator.scenario import load as load_scenario
from gpu_monitoring.snapshot import Device, Node, Snapshot
from gpu_monitoring.status import Status

from .report import Report, Table

PAGES = Path(__file__).resolve().parents[2] / "tests" / "data" / "dcgm"
DEFAULT_PAGE = "a100-8gpu-default-4.x.txt"
FULL_PAGE = "a100-8gpu-4.x.txt"
READS = 200
LIMIT_MS = 2.0
# 8x A100-SXM4-80GB; the exporter runs with dcgm-exporter's default counters whatever the scenario says.
WHOLE_READ_SCENARIO = "hpc-slurm"
WHOLE_READS = 20
WHOLE_READ_ROUNDS = 10
# Check runs of a steady node, 15 s apart: DCGM's 30 s samples change every other read.
RUN_INTERVAL = 15.0


def _snapshot(body: bytes, nvml_throughput: bool) -> Snapshot:
    """The node the page is of: its 8 GPUs, with NVML's PCIe and NVLink throughput or without."""
    return _node(dict.fromkeys(re.findall(r'UUID="(GPU-[^"]+)"', body.decode())), nvml_throughput)


def _node(uuids, nvml_throughput: bool) -> Snapshot:
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


def measure_whole(rounds: int) -> float:
    """ms of CPU per steady whole read as the check makes it (DcgmReader.enrich, NVML giving PCIe and
    NVLink throughput): this thread's CPU only, the exporter's own (rendering its page) left out. The
    median of `rounds` rounds of WHOLE_READS reads, after one that opens the connection."""
    nvml = SimulatedNvml(load_scenario(WHOLE_READ_SCENARIO), SimClock(speed=0))
    uuids = [device.spec.uuid for device in nvml.devices]
    per_round: List[float] = []
    with DcgmExporterServer(nvml, DcgmExporterSpec()) as exporter:
        reader = DcgmReader(exporter.url)
        _whole_read(reader, _node(uuids, True))
        try:
            for _ in range(max(rounds, 1)):
                snapshots = [_node(uuids, True) for _ in range(WHOLE_READS)]
                spent = 0.0
                for snapshot in snapshots:
                    nvml.advance(RUN_INTERVAL)
                    started = time.thread_time()
                    _whole_read(reader, snapshot)
                    spent += time.thread_time() - started
                per_round.append(spent * 1000 / WHOLE_READS)
        finally:
            reader.close()
    return statistics.median(per_round)


def _whole_read(reader: DcgmReader, snapshot: Snapshot) -> None:
    state = reader.enrich(snapshot, None)
    if state != (Status.OK, None) or not snapshot.devices[0].metrics.keys() - LINK_METRICS:
        raise RuntimeError(f"the DCGM read measured gave no activity: {state}")


def table(rounds: int, report: Report) -> Table:
    whole = measure_whole(min(rounds, WHOLE_READ_ROUNDS))
    rows = [
        ["8x A100 (simulated), default counters, through dcgm-exporter over loopback: the whole read "
         "(HTTP, parse, join); NVML gives PCIe and NVLink throughput", whole,
         report.target("CPU a DCGM read adds per run, 8 GPUs, default counters, HTTP included", whole,
                       f"< {LIMIT_MS:g} ms", whole < LIMIT_MS)],
        ["8x A100, default counters, parse and join alone; NVML gives PCIe and NVLink throughput",
         report.quote("dcgm_parse_join_ms", measure(DEFAULT_PAGE, True, rounds)), ""],
        ["8x A100, default counters; no NVML throughput (DCGM's PCIe bytes parsed too)",
         measure(DEFAULT_PAGE, False, rounds), ""],
        ["8x A100, default counters + SM active/occupancy, FP pipes, NVLink bytes", measure(FULL_PAGE, True, rounds),
         ""],
    ]
    return Table(
        "A DCGM read (dcgm-exporter's page fetched, parsed, judged fresh, joined to the snapshot)",
        ["page", "CPU ms per read", "verdict"],
        rows,
        ["a steady read: only the lines of the DCGM_FI_PROF_* fields a GPU lacks are kept; prometheus_client's "
         "parser reads each series the first time the exporter sends it, later reads only its value; the "
         "heartbeat lines are compared as text; comments and every other field are skipped by name. "
         "The whole read's GET is http.client's on one kept-alive connection (a GET through requests "
         "costs over 1 ms of CPU); its figure is the reading thread's CPU, the exporter's left out"],
    )
