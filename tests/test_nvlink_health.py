"""NVLink in device health: links that have never been up are no fault; links that went down are.

Scenario a100-pcie: GPUs 0 and 1 are A100 80GB PCIe without an NVLink bridge (12 links, every one
inactive), GPUs 2 and 3 a bridged pair (12 links up). Tests that need links to fail add faults to
a copy of it.
"""

import pytest
import yaml
from datadog_checks.base import AgentCheck
from datadog_checks.base.stubs import aggregator as _aggregator

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.health.device_health import NvLinkMemory
from gpu_monitoring.metrics.spec import PROFILES, SPEC
from gpu_monitoring.simulator.scenario import resolve
from gpu_monitoring.snapshot import Device

from .conftest import NAMESPACE, SimulatedNode
from .sidecar_support import SidecarProcess

OK, WARNING = AgentCheck.OK, AgentCheck.WARNING
BRIDGELESS, BRIDGED = (0, 1), (2, 3)
LINKS = 12
EVERY_LINK = "NVLink down: link " + ", ".join(map(str, range(LINKS)))


def nvlink_reasons(node):
    """{gpu index: the NVLink reasons of its health} in the last run."""
    return {index: [r for r in (stub.message or "").split("; ") if r.startswith("NVLink")]
            for index, stub in node.health().items()}


def a100_pcie(tmp_path, faults):
    """a100-pcie with these faults, under the same file name."""
    raw = yaml.safe_load(resolve("a100-pcie").read_text())
    raw["faults"] = faults
    path = tmp_path / "a100-pcie.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def links_down(devices, links, at, duration=None):
    """nvlink_down faults for these links of these GPUs; without a duration they stay down."""
    return [{"at": at, "kind": "nvlink_down", "device": device, "link": link, "duration": duration}
            for device in devices for link in links]


def test_cards_without_a_bridge_are_healthy_run_after_run(node):
    a100 = node("a100-pcie")
    for _ in range(4):
        a100.run()
        assert a100.statuses() == dict.fromkeys(range(4), OK)
        assert nvlink_reasons(a100) == dict.fromkeys(range(4), [])
        assert a100.values("nvlink.links.active") == {0: 0, 1: 0, 2: LINKS, 3: LINKS}
    # The simulated driver answers as a real one without a bridge: nothing crosses the links, no errors.
    tx = a100.values("nvlink.throughput.tx")
    assert [tx[i] for i in BRIDGELESS] == [0, 0] and all(tx[i] > 0 for i in BRIDGED)
    for counter in ("crc_flit", "crc_data", "replay", "recovery"):
        assert set(a100.values(f"nvlink.errors.{counter}").values()) == {0}, counter


def test_every_series_of_the_scenario_is_in_the_spec(node, aggregator):
    node("a100-pcie").run(2)
    names = {name[len(NAMESPACE):] for name in aggregator.metric_names}
    assert "nvlink.links.active" in names
    assert sorted(names - set(SPEC)) == []


def test_a_link_of_a_bridged_gpu_going_down_is_named(node):
    faults = node("faults").run_until(45)
    assert nvlink_reasons(faults)[0] == []
    faults.run_until(60)  # NVLink 3 of GPU 0 is down from t=50 to t=80
    assert faults.statuses()[0] == WARNING
    assert nvlink_reasons(faults)[0] == ["NVLink down: link 3"]
    faults.run_until(90)
    assert nvlink_reasons(faults)[0] == []


def test_links_that_were_up_and_all_went_down(node, tmp_path):
    a100 = node(a100_pcie(tmp_path, links_down(BRIDGED, range(LINKS), at=30, duration=30))).run_until(15)
    assert a100.statuses() == dict.fromkeys(range(4), OK)
    # Down at t=30 and t=45: the second run is judged on what the check saw earlier, not the last run.
    for until in (30, 45):
        a100.run_until(until)
        assert a100.values("nvlink.links.active") == dict.fromkeys(range(4), 0)
        assert a100.statuses() == {0: OK, 1: OK, 2: WARNING, 3: WARNING}
        assert nvlink_reasons(a100) == {0: [], 1: [], 2: [EVERY_LINK], 3: [EVERY_LINK]}
    a100.run_until(60)
    assert a100.statuses() == dict.fromkeys(range(4), OK)


def test_some_links_up_and_some_not_from_the_first_run(node, tmp_path):
    a100 = node(a100_pcie(tmp_path, links_down(BRIDGED, [5], at=0)))
    for _ in range(2):
        a100.run()
        assert a100.values("nvlink.links.active") == {0: 0, 1: 0, 2: LINKS - 1, 3: LINKS - 1}
        assert a100.statuses() == {0: OK, 1: OK, 2: WARNING, 3: WARNING}
        assert nvlink_reasons(a100) == {0: [], 1: [], 2: ["NVLink down: link 5"], 3: ["NVLink down: link 5"]}


@pytest.mark.parametrize("profile", PROFILES)
def test_the_rule_holds_whatever_series_the_profile_sends(node, tmp_path, profile):
    # GPU 2 has link 5 down from the start; GPU 3 loses every link at t=15.
    faults = links_down([2], [5], at=0) + links_down([3], range(LINKS), at=15)
    a100 = node(a100_pcie(tmp_path, faults), metrics_profile=profile).run()
    assert nvlink_reasons(a100) == {0: [], 1: [], 2: ["NVLink down: link 5"], 3: []}
    a100.run()
    assert nvlink_reasons(a100) == {0: [], 1: [], 2: ["NVLink down: link 5"], 3: [EVERY_LINK]}


def test_the_check_remembers_links_across_sidecar_restarts(tmp_path, datadog_agent):
    # The sidecar serves snapshots; the check judges them, so what it saw up outlives a sidecar restart.
    scenario = a100_pcie(tmp_path, links_down(BRIDGED, range(LINKS), at=60))
    first = SidecarProcess(tmp_path, scenario).start()
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{"kubernetes": False, "source": "sidecar",
                                                       "sidecar_socket": first.socket}])
    try:
        _aggregator.reset()
        assert check.run() == ""
        assert SimulatedNode.statuses() == dict.fromkeys(range(4), OK)
        assert first.stop() == 0
        second = SidecarProcess(tmp_path, scenario, "--start-at", "60").start()
        try:
            _aggregator.reset()
            assert check.run() == ""
            assert SimulatedNode.statuses() == {0: OK, 1: OK, 2: WARNING, 3: WARNING}
            assert nvlink_reasons(SimulatedNode) == {0: [], 1: [], 2: [EVERY_LINK], 3: [EVERY_LINK]}
        finally:
            second.stop()
    finally:
        check.cancel()
        _aggregator.reset()


@pytest.mark.parametrize("lost", [False, True])
def test_a_gpu_is_remembered_while_listed_and_forgotten_when_gone(lost):
    memory = NvLinkMemory()
    memory.remember([Device(index=0, uuid="GPU-up", nvlink_states=[1] * 12),
                     Device(index=1, uuid="GPU-never", nvlink_states=[0] * 12)])
    assert memory.seen_up("GPU-up") == frozenset(range(12)) and not memory.seen_up("GPU-never")
    # Down now (or fallen off the bus, with nothing read): still a GPU whose links were up.
    memory.remember([Device(index=0, uuid="GPU-up", lost=lost, nvlink_states=[] if lost else [0] * 12)])
    assert memory.seen_up("GPU-up") == frozenset(range(12))
    memory.remember([])  # the GPU is gone from the node
    assert not memory.seen_up("GPU-up")
