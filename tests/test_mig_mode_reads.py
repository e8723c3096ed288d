"""MIG mode, read through pynvml from the simulated driver only when it may have changed: at a
session's first run, on a GPU that lists no process, while a mode set waits for the GPU's reset,
and every MIG_MODE_INTERVAL seconds; every run's snapshot carries it all the same."""

from contextlib import contextmanager

import yaml

from gpu_monitoring.collectors.mig import MIG_MODE_INTERVAL, Mig
from gpu_monitoring.collectors.node_reader import NodeReader
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import load as load_scenario
from gpu_monitoring.simulator.scenario import resolve

from .test_inventory import Clock

MIG_MODE = "nvmlDeviceGetMigMode"
# dgx-h100's GPUs that list no process: GPU 5 (GPU 7 lists the process a failed pod left).
IDLE = [5]


def dgx_h100(tmp_path, **facts_of):
    """dgx-h100 without Kubernetes, each GPU `facts_of["gpu<i>"]` given those facts."""
    raw = yaml.safe_load(resolve("dgx-h100").read_text())
    raw.pop("kubernetes")
    for index, device in enumerate(raw["devices"]):
        device.update(facts_of.get(f"gpu{index}", {}))
    path = tmp_path / "dgx-h100.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@contextmanager
def reading(scenario, clock=None, disabled=()):
    """A node reader on the simulated driver of `scenario`, its MIG collector timed by `clock`."""
    sim = SimulatedNvml(load_scenario(scenario), SimClock(speed=0))
    reader = NodeReader(NvmlSession(sim.library), disabled={"mig", *disabled}, proc_root=None, watch_events=False)
    processes = next((c for c in reader.collectors if c.name == "processes"), None)
    reader.collectors.append(Mig([], processes=processes, clock=clock or Clock()))
    try:
        yield sim, reader
    finally:
        reader.close()


def asked_per_run(sim, reader, runs):
    """MIG mode calls in each of `runs` runs, and the last run's snapshot."""
    asked = []
    for _ in range(runs):
        before = sim.calls[MIG_MODE]
        sim.advance(15)
        taken = reader.read()
        asked.append(sim.calls[MIG_MODE] - before)
    return asked, taken


def test_a_busy_gpu_is_asked_once_a_session_an_idle_one_every_run(tmp_path):
    with reading(dgx_h100(tmp_path)) as (sim, reader):
        asked, taken = asked_per_run(sim, reader, 4)
    assert asked == [8] + [len(IDLE)] * 3
    # Every snapshot carries the mode, read this run or not.
    assert [device.mig_enabled for device in taken.devices] == [False] * 8


def test_it_is_asked_again_once_the_interval_has_passed(tmp_path):
    clock = Clock()
    with reading(dgx_h100(tmp_path), clock) as (sim, reader):
        asked, _ = asked_per_run(sim, reader, 1)
        clock.now += MIG_MODE_INTERVAL - 1
        asked += asked_per_run(sim, reader, 1)[0]
        clock.now += 1
        asked += asked_per_run(sim, reader, 2)[0]
    assert asked == [8, len(IDLE), 8, len(IDLE)]


def test_a_mode_set_for_the_next_reset_is_watched_every_run(tmp_path):
    # `nvidia-smi -i 0 -mig 1` while GPU 0 runs a process: MIG stays off until the GPU is reset.
    with reading(dgx_h100(tmp_path, gpu0={"mig_mode_pending": 1})) as (sim, reader):
        asked, taken = asked_per_run(sim, reader, 3)
        assert asked == [8] + [1 + len(IDLE)] * 2
        assert taken.devices[0].mig_enabled is False
        # Set back (`-mig 0`): the next read sees nothing pending, and the GPU is busy.
        sim.devices[0].spec.facts["mig_mode_pending"] = 0
        asked, _ = asked_per_run(sim, reader, 2)
    assert asked == [1 + len(IDLE), len(IDLE)]


def test_a_new_session_asks_every_gpu_again(tmp_path):
    # A driver reload, or a GPU reset that cost the GPU its handle, restarts NVML.
    with reading(dgx_h100(tmp_path)) as (sim, reader):
        asked, _ = asked_per_run(sim, reader, 2)
        reader.restart()
        asked += asked_per_run(sim, reader, 2)[0]
    assert asked == [8, len(IDLE), 8, len(IDLE)]


def test_without_process_lists_it_is_asked_every_run(tmp_path):
    with reading(dgx_h100(tmp_path), disabled={"processes"}) as (sim, reader):
        asked, _ = asked_per_run(sim, reader, 3)
    assert asked == [8, 8, 8]


def test_mig_gpus_send_the_same_series_on_runs_that_do_not_ask(node):
    mig = node("a100-mig").run()
    first = (mig.values("mig.enabled"), mig.values("mig.instances"))
    mig.sim.calls.clear()
    mig.run(2)
    assert (mig.values("mig.enabled"), mig.values("mig.instances")) == first == (
        {0: 1, 1: 1, 2: 0, 3: 1}, {0: 4, 1: 7, 3: 1})
    # Each MIG GPU's parent lists its instances' processes, and GPU 2 (MIG off) runs one: none asked.
    assert mig.sim.calls[MIG_MODE] == 0


def test_the_first_busy_run_after_an_idle_one_asks(tmp_path):
    # GPU 5 idles until a process starts at t=50: MIG mode may have been set in the meantime, before it
    # started. Runs at t=15, 30, 45 find it idle; t=60 busy for the first time; t=75 busy again.
    started = {"processes": [{"pid": 61001, "name": "python3", "memory_mib": 1000, "start": 50}]}
    with reading(dgx_h100(tmp_path, gpu5=started)) as (sim, reader):
        asked, taken = asked_per_run(sim, reader, 5)
    assert asked == [8, 1, 1, 1, 0]
    assert [p.pid for p in taken.devices[5].processes] == [61001]
