"""The four link states of NVML_FI_DEV_NVLINK_GET_STATE in device health, a state outside them, and
the links a GPU was seen with up, remembered across a restart of the check."""

import yaml
from datadog_checks.base import AgentCheck

from gpu_monitoring.simulator.scenario import resolve

from .conftest import SimulatedNode
from .test_nvlink_health import EVERY_LINK, LINKS, a100_pcie, links_down, nvlink_reasons

OK, WARNING = AgentCheck.OK, AgentCheck.WARNING
CHECK_ID = "gpu_monitoring:nvlink-restart"


def test_a_sleeping_link_is_up_and_a_link_without_traffic_is_a_fault(node, tmp_path):
    faults = [{"at": 0, "kind": "nvlink_down", "device": 2, "link": 4, "state": 2},
              {"at": 0, "kind": "nvlink_down", "device": 3, "link": 6, "state": 3}]
    a100 = node(a100_pcie(tmp_path, faults)).run()
    assert a100.values("nvlink.links.active") == {0: 0, 1: 0, 2: LINKS, 3: LINKS - 1}
    assert a100.values("nvlink.links.inactive") == {0: LINKS, 1: LINKS, 2: 0, 3: 0}
    assert a100.statuses() == {0: OK, 1: OK, 2: OK, 3: WARNING}
    assert nvlink_reasons(a100)[3] == ["NVLink up but its traffic disabled: link 6"]


def test_a_state_outside_the_enum_is_unknown_not_up(node, tmp_path):
    a100 = node(a100_pcie(tmp_path, [{"at": 0, "kind": "nvlink_down", "device": 2, "link": 1, "state": 9}])).run()
    assert a100.values("nvlink.links.active")[2] == LINKS - 1
    assert nvlink_reasons(a100)[2] == ["NVLink state unknown: link 1 (9)"]


def test_a_link_that_went_down_across_a_restart_is_still_down(tmp_path, datadog_agent):
    # The bridged pair loses every link at t=60, while no check runs: after the restart every
    # link is inactive, as on the cards without a bridge, yet these were seen up before.
    scenario = a100_pcie(tmp_path, links_down((2, 3), range(LINKS), at=60))
    before = SimulatedNode(scenario)
    before.check.check_id = CHECK_ID
    try:
        before.run(3)
        assert before.statuses() == dict.fromkeys(range(4), OK)
    finally:
        before.check.cancel()
    after = SimulatedNode(scenario)
    after.check.check_id = CHECK_ID
    try:
        after.sim.advance(75 - after.now)
        after.run()
        assert after.values("nvlink.links.active") == dict.fromkeys(range(4), 0)
        assert after.statuses() == {0: OK, 1: OK, 2: WARNING, 3: WARNING}
        assert nvlink_reasons(after) == {0: [], 1: [], 2: [EVERY_LINK], 3: [EVERY_LINK]}
    finally:
        after.check.cancel()
    # Another check (another instance) has a memory of its own.
    other = SimulatedNode(scenario)
    other.check.check_id = "gpu_monitoring:another"
    try:
        other.sim.advance(75 - other.now)
        other.run()
        assert other.statuses() == dict.fromkeys(range(4), OK)
    finally:
        other.check.cancel()


def test_a_memory_that_cannot_be_read_is_empty(tmp_path, datadog_agent):
    scenario = resolve("a100-pcie")
    datadog_agent.write_persistent_cache(f"{CHECK_ID}_nvlink_seen_up", "not json")
    simulated = SimulatedNode(scenario)
    simulated.check.check_id = CHECK_ID
    try:
        simulated.run()
        assert simulated.statuses() == dict.fromkeys(range(4), OK)
        saved = yaml.safe_load(datadog_agent.read_persistent_cache(f"{CHECK_ID}_nvlink_seen_up"))
        assert sorted(map(len, saved.values())) == [LINKS, LINKS]  # the bridged pair's links
    finally:
        simulated.check.cancel()
