"""One version of the check measured against its submission floor, turn by turn, for `bench_versus.py`.

    python -P versus_child.py SCENARIO METRICS_PROFILE    (cwd and PYTHONPATH: the version's root and root/scripts)

It is run by path from the tree of the code being compared, in the root of the version it measures,
which may be older: so it uses only what every version's bench_support has (`Bench`, `FloorCheck`
and the floor's run, set up as `floor.compare` sets them up) and loads the interleaving from beside
itself. It speaks JSON lines on its stdout: first the file it imported gpu_monitoring from and the
floor's series; then, for each `run N` read on stdin, the per-run figures of N more rounds.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, TextIO

import gpu_monitoring
from bench_support.floor import FloorCheck, _floor_run
from bench_support.harness import Bench, quiet_logs, series_count


def main(scenario: str, metrics_profile: str) -> None:
    replies = _protocol_out()
    quiet_logs()
    interleave = _interleave()
    with Bench(scenario, metrics_profile=metrics_profile) as bench:
        floor = FloorCheck(bench.warm_up(2))
        floor.run()  # its own first run (initializations) is no steady one either
        _reply(replies, gpu_monitoring=gpu_monitoring.__file__, floor_series=len(floor.series))
        done = 0
        for line in sys.stdin:
            rounds = int(line.split()[1])  # "run N"
            checks, floors = interleave(rounds, lambda: (bench.run(), series_count()),
                                        lambda: _floor_run(floor), start=done)
            done += rounds
            _reply(replies, cpu=[r.cpu for r, _ in checks], own=[r.own for r, _ in checks],
                   own_and_entry=[r.own_and_entry for r, _ in checks], series=[s for _, s in checks],
                   floor=floors)


def _protocol_out() -> TextIO:
    """The replies' own copy of stdout; stdout itself goes to stderr, so nothing the check or a
    library prints can garble a reply."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return replies


def _interleave() -> Callable[..., Any]:
    spec = importlib.util.spec_from_file_location("versus_interleave", Path(__file__).with_name("interleave.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.interleave


def _reply(replies: TextIO, **figures: Any) -> None:
    replies.write(json.dumps(figures) + "\n")
    replies.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
