"""Reads of `<proc_root>/<pid>/...` files per run, for processes seen before and for new ones.

An audit hook counts every `open` under the simulated proc root: nothing of the check is
replaced. Audit hooks cannot be removed and are called on every audited event (each ctypes
call among them), so the count runs in a child process of its own, away from the CPU figures.
"""

import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, Tuple

from . import children
from .harness import Bench, per, quiet_logs


@dataclass
class ProcReads:
    processes: int
    first_run: Dict[str, int]  # file name -> reads, in the run that sees every process first
    steady_runs: int
    steady: Dict[str, int] = field(default_factory=dict)  # file name -> reads over the steady runs

    @property
    def per_new_process(self) -> float:
        return per(sum(self.first_run.values()), self.processes)

    @property
    def steady_per_run(self) -> float:
        return per(sum(self.steady.values()), self.steady_runs)


class OpenCounter:
    def __init__(self, root: str):
        self.root = root.rstrip("/") + "/"
        self.reads: Counter = Counter()  # (pid, file name)

    def __call__(self, event: str, args: Tuple[Any, ...]) -> None:
        if event != "open" or not isinstance(args[0], str) or not args[0].startswith(self.root):
            return
        parts = args[0][len(self.root):].split("/")
        if len(parts) >= 2 and parts[0].isdigit():
            self.reads[(parts[0], parts[-1])] += 1

    def take(self) -> Counter:
        taken, self.reads = self.reads, Counter()
        return taken


def count_reads(scenario: str, runs: int) -> ProcReads:
    """In a child process: the hook must not outlive the count in the bench's own process."""
    context = children.context()
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_count_here, scenario, runs).result()


def _count_here(scenario: str, runs: int) -> ProcReads:
    quiet_logs()
    with Bench(scenario) as bench:
        counter = OpenCounter(bench.proc_root)
        sys.addaudithook(counter)
        bench.run()
        first = counter.take()
        for _ in range(runs):
            bench.run()
        steady = counter.take()
    return ProcReads(
        processes=_processes(bench),
        first_run=_by_file(first),
        steady_runs=runs,
        steady=_by_file(steady),
    )


def _processes(bench: Bench) -> int:
    """The scenario's GPU processes, whether or not the check read anything of them."""
    specs = [device.spec for device in bench.sim.devices]
    return sum(len(spec.processes) + sum(len(m.processes) for m in spec.mig) for spec in specs)


def _by_file(reads: Counter) -> Dict[str, int]:
    found: Counter = Counter()
    for (_pid, name), count in reads.items():
        found[name] += count
    return dict(found)
