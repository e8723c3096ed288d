"""The driver's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): its series, tagged with the
action, and the health each value sets; read after the XID 154 that tells of a change, in local and
sidecar mode.

Scenario hgx-b200 (driver 580): from t=25 to t=45 the driver asks for GPU 2 to be drained and reset.
"""

import pytest
from datadog_checks.base import AgentCheck

from gpu_monitoring.health.device_health import evaluate
from gpu_monitoring.health.recovery_actions import ACTIONS
from gpu_monitoring.snapshot import Device, Event, Node, Snapshot
from gpu_monitoring.sources import SidecarSource

OK, WARNING, CRITICAL = AgentCheck.OK, AgentCheck.WARNING, AgentCheck.CRITICAL


def actions(node):
    return node.keyed("device.recovery_action", lambda t: (int(t["gpu_index"]), t["recovery_action"]))


def test_the_action_is_a_series_tagged_with_its_name_and_clears(node):
    b200 = node("hgx-b200").run(1)
    assert actions(b200) == {(index, "none"): 0 for index in range(8)}
    b200.run_until(30)
    assert actions(b200)[(2, "drain_and_reset")] == 4
    assert b200.health()[2].status == CRITICAL
    assert "recovery action drain and reset: drain the GPU of its workloads" in b200.health()[2].message
    b200.run_until(45)
    assert actions(b200)[(2, "none")] == 0 and b200.health()[2].status == OK


def test_the_action_is_read_in_the_run_that_drains_its_xid(node, aggregator):
    """Events are drained before the devices are read: the run that submits XID 154 has the new action."""
    b200 = node("hgx-b200").run_until(30)
    assert [event["msg_title"] for event in aggregator.events if "XID 154" in event["msg_title"]]
    assert actions(b200)[(2, "drain_and_reset")] == 4


def test_a_driver_before_r565_is_not_asked_again(node):
    dgx = node("dgx-h100").run(2)
    assert actions(dgx) == {}
    assert dgx.sim.field_refusals[0, 230] == 1  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, the first run only


@pytest.mark.parametrize("value", sorted(ACTIONS))
def test_each_action_sets_its_status_with_words_to_act_on(value):
    health = evaluate(Device(index=0, uuid="GPU-1", recovery_action=value), None, [])
    expected = {None: OK, "warning": WARNING, "critical": CRITICAL}[ACTIONS[value].severity]
    assert health.status == expected
    if value:
        assert health.message == (f"the driver asks for recovery action {ACTIONS[value].name.replace('_', ' ')}: "
                                  f"{ACTIONS[value].advice}")
    assert {ACTIONS[v].name for v in (1, 2, 4, 5, 6, 7)} == {
        "gpu_reset", "node_reboot", "drain_and_reset", "recover_imex_domain", "bus_reset", "system_reboot"}
    assert ACTIONS[3].severity == "warning"


def test_an_action_outside_the_enum_is_not_trusted():
    health = evaluate(Device(index=0, uuid="GPU-1", recovery_action=42), None, [])
    assert health.status == WARNING
    assert "recovery action 42, which this check does not know" in health.message


class Page:
    """One page of the journal, as the sidecar client gives it."""

    lost = False

    def __init__(self, last_seq, events):
        self.journal_last_seq = self.last_seq = last_seq
        self.events = events


class JournalFirst:
    """A sidecar client that records what the source asks, in order."""

    def __init__(self):
        self.asked = []

    def snapshot(self):
        self.asked.append("snapshot")
        return Snapshot(timestamp=0, node=Node(), devices=[Device(index=0, uuid="GPU-1")])

    def get(self, path):
        self.asked.append(path)
        return {"epoch": "e"}

    def events(self, cursor):
        self.asked.append("events")
        return Page(1, [Event(device_uuid="GPU-1", kind="xid", code=154, timestamp=1.0)] if cursor < 1 else [])


def test_sidecar_mode_reads_the_snapshot_after_the_events():
    """The sidecar journals events in a thread of its own: the snapshot asked after them reads the
    recovery action as it is after every XID 154 this run hands out."""
    client = JournalFirst()
    snapshot = SidecarSource(client, lambda: "", lambda value: None).read()
    assert client.asked.index("snapshot") > max(i for i, asked in enumerate(client.asked) if asked == "events")
    assert [e.code for e in snapshot.events] == [154]
