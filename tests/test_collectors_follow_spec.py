"""Collectors produce only series declared against metrics.yaml, and the node run tells them when a run begins."""

from pathlib import Path
from typing import List

import pytest

from gpu_monitoring.collectors.base import Collector
from gpu_monitoring.collectors.node_reader import NodeReader
from gpu_monitoring.collectors.series import fact, gauge, monotonic_count, store
from gpu_monitoring.metrics.profile import Profile
from gpu_monitoring.metrics.spec import SPEC
from gpu_monitoring.nvml.readings import field
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.node import simulated_node
from gpu_monitoring.simulator.scenario import available
from gpu_monitoring.simulator.scenario import load as load_scenario
from gpu_monitoring.snapshot import Device, Snapshot

# Device-scope metrics that submission makes (prices, processes left out by max_processes), not a collector.
# Made where the snapshot is judged: costs, what was left out, inventory, and the PCIe AER errors the check
# counts from sysfs totals and the kernel's log (health.pcie_aer).
SUBMITTED_NOT_COLLECTED = {"cost.hourly", "cost.idle_hourly", "processes.omitted", "device.persistence_mode",
                           "pcie.aer.corrected", "pcie.aer.nonfatal", "pcie.aer.fatal",
                           "processes.zombie", "processes.zombie.memory"}  # attribution tells zombies


def test_a_misspelt_metric_fails_where_it_is_declared():
    with pytest.raises(ValueError, match="'temperatur' is not in metrics.yaml"):
        gauge("temperatur")
    with pytest.raises(ValueError, match="'energy.consumed' is a monotonic_count in metrics.yaml, not a gauge"):
        gauge("energy.consumed")
    with pytest.raises(ValueError, match="'temperature' is a gauge in metrics.yaml, not a monotonic_count"):
        monotonic_count("temperature")
    with pytest.raises(ValueError, match="'nvlink_up' is not a field"):
        fact("nvlink_up")
    # The reading a collector asks NVML's field batch for, too.
    with pytest.raises(ValueError, match="'memory_temprature' is no reading of nvml.readings"):
        field("memory_temprature")
    assert field("nvlink_state", 3) == ("nvlink_state", 3)


def test_readings_are_stored_by_kind_and_part():
    device = Device(index=0, uuid="GPU-0")
    store([
        (gauge("temperature"), 41), (gauge("fan.speed"), None), (fact("nvlink_states"), [1, 0]),
        (gauge("nvlink.throughput.tx", ("nvlink_port:3",)), 5.0), (gauge("nvlink.throughput.tx"), 7.0),
    ], device)
    assert device.metrics == {"temperature": 41, "nvlink.throughput.tx": 7.0}
    assert device.tagged_metrics == {"nvlink_port:3": {"nvlink.throughput.tx": 5.0}}
    assert device.nvlink_states == [1, 0]


def _snapshots(scenario: str, runs: int = 3) -> List[Snapshot]:
    node = simulated_node(scenario, SimClock(speed=0))
    standing_in = node.start(serve_kubernetes=False)
    reader = NodeReader(NvmlSession(node.nvml.library), proc_root=standing_in["proc_root"])
    try:
        taken = []
        for run in range(runs):
            if run:
                node.nvml.advance(15)
            taken.append(reader.read())
        return taken
    finally:
        reader.close()
        node.stop()


# NVLink 5's counters answer only on Blackwell: a board of two, beside the shipped scenarios.
NVLINK5_BOARD = str(Path(__file__).parent / "data" / "nvlink5-board.yaml")


@pytest.fixture(scope="module")
def produced() -> dict:
    """Every metric each scenario's collectors produced over three runs, by scenario."""
    found = {}
    for scenario in [*available(), NVLINK5_BOARD]:
        names = set()
        for snapshot in _snapshots(scenario):
            for device in snapshot.devices:
                for target in (device, *device.mig_instances):
                    names.update(target.metrics)
                    for values in target.tagged_metrics.values():
                        names.update(values)
        found[scenario] = names
    return found


def test_every_collector_of_every_scenario_produces_device_metrics_of_the_spec(produced):
    for scenario, names in produced.items():
        unlisted = sorted(name for name in names if SPEC.get(name) is None or SPEC[name].scope != "device")
        assert not unlisted, f"{scenario}: {unlisted}"


def test_every_device_metric_of_the_spec_is_produced_by_some_scenario(produced):
    collected = set().union(*produced.values())
    device_metrics = {name for name, metric in SPEC.items() if metric.scope == "device"}
    assert sorted(device_metrics - SUBMITTED_NOT_COLLECTED - collected) == []


class RunRecorder(Collector):
    """A collector of nothing that notes what the node run tells it."""

    name = "recorder"

    def __init__(self) -> None:
        self.heard: List[str] = []

    def begin_run(self) -> None:
        self.heard.append("begin")

    def collect(self, device, fields):
        self.heard.append(f"GPU {device.index}")
        return []


def test_the_node_run_tells_collectors_a_run_begins_before_any_device():
    sim = SimulatedNvml(load_scenario("t4-shared"), SimClock(speed=0))
    reader = NodeReader(NvmlSession(sim.library))
    recorder = RunRecorder()
    reader.collectors.append(recorder)
    try:
        reader.read()
        reader.read()
    finally:
        reader.close()
    one_run = ["begin"] + [f"GPU {index}" for index in range(len(sim.scenario.devices))]
    assert recorder.heard == one_run * 2


def test_the_node_reader_hands_every_collector_its_profile_when_it_builds_it():
    sim = SimulatedNvml(load_scenario("a100-mig"), SimClock(speed=0))
    essential = Profile("essential")
    reader = NodeReader(NvmlSession(sim.library), proc_root=None, watch_events=False, profile=essential)
    try:
        mig = next(collector for collector in reader.collectors if collector.name == "mig")
        assert {collector.profile for collector in [*reader.collectors, *mig.instance_collectors]} == {essential}
        # Collectors MIG instances are read by are the GPUs' own, not copies.
        assert all(collector in reader.collectors for collector in mig.instance_collectors)
    finally:
        reader.close()
