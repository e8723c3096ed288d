"""NVML's recovery-action and GPU-unavailable events from the simulated driver to the snapshot and
the device's health; a driver that lists a type yet refuses it keeps the others."""

import pynvml
import yaml
from datadog_checks.base import AgentCheck

from gpu_monitoring.collectors.node_reader import NodeReader
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import load as load_scenario
from gpu_monitoring.simulator.scenario import resolve

from .conftest import H100_PCIE_NODE

DRAIN_AND_RESET = pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET


def board(tmp_path, faults, **model):
    """A copy of hgx-b200 (driver 580) with only these faults, its B200 model changed by `model`."""
    scenario = yaml.safe_load(resolve("hgx-b200").read_text())
    scenario["faults"] = faults
    scenario["models"]["b200"].update(model)
    path = tmp_path / "board-events.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return str(path)


def events_until(scenario, seconds):
    """(GPU index, kind, code) of every event the node reads up to `seconds` of scenario time."""
    sim = SimulatedNvml(load_scenario(scenario), SimClock(speed=0))
    reader = NodeReader(NvmlSession(sim.library), proc_root=None)
    seen = []
    try:
        for run in range(int(seconds // 15) + 1):
            if run:
                sim.advance(15)
            seen += [(e.device_index, e.kind, e.code) for e in reader.read().events]
    finally:
        reader.close()
    return seen


def test_a_recovery_action_comes_as_its_event_and_xid_154(tmp_path):
    faults = [{"at": 5, "kind": "recovery_action", "device": 2, "action": "drain_and_reset", "duration": 20}]
    assert sorted(events_until(board(tmp_path, faults), 15)) == [
        (2, "recovery_action", DRAIN_AND_RESET), (2, "xid", 154)]


def test_a_driver_before_r565_tells_of_it_with_xid_154_alone(tmp_path):
    scenario = tmp_path / "old.yaml"
    scenario.write_text(H100_PCIE_NODE + "devices:\n  - {model: h100, load: {utilization: 50}}\n"
                        "faults:\n  - {at: 5, kind: recovery_action, device: 0, action: gpu_reset}\n"
                        "  - {at: 5, kind: gpu_unavailable, device: 0}\n")
    assert events_until(str(scenario), 15) == [(0, "xid", 154)]


def test_a_type_the_driver_lists_but_refuses_costs_only_itself(tmp_path):
    faults = [{"at": 5, "kind": "recovery_action", "device": 2, "action": "drain_and_reset"},
              {"at": 5, "kind": "xid", "device": 1, "xid": 13}]
    scenario = board(tmp_path, faults, refused_event_types=["nvmlEventTypeGpuRecoveryAction"])
    assert sorted(events_until(scenario, 15)) == [(1, "xid", 13), (2, "xid", 154)]


def test_an_unavailable_gpu_is_critical_until_it_is_reset(node, tmp_path):
    b200 = node(board(tmp_path, [{"at": 5, "kind": "gpu_unavailable", "device": 3}])).run_until(15)
    assert b200.health()[3].status == AgentCheck.CRITICAL
    assert b200.health()[3].message.startswith("the GPU is unavailable: ")
    b200.run()  # no new event: the verdict is held
    assert b200.health()[3].status == AgentCheck.CRITICAL
    assert "the GPU is unavailable: " in b200.health()[3].message
