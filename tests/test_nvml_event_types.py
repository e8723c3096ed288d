"""NVML's recovery-action and GPU-unavailable events (R565): what the simulator raises for them, how
health judges them, and that the snapshot and the sidecar's journal carry their kinds."""

import pynvml

from gpu_monitoring.health import device_health as health
from gpu_monitoring.nvml.events import EVENT_KINDS, UNREGISTERED, RawEvent
from gpu_monitoring.sidecar.journal import Journal
from gpu_monitoring.simulator.fault_events import event_types, events_of
from gpu_monitoring.simulator.scenario import Fault
from gpu_monitoring.snapshot import Device, Event, Node, Snapshot, load
from gpu_monitoring.status import Status

XID = pynvml.nvmlEventTypeXidCriticalError
RECOVERY = pynvml.nvmlEventTypeGpuRecoveryAction
UNAVAILABLE = pynvml.nvmlEventTypeGpuUnavailableError
NEW_KINDS = ("recovery_action", "gpu_unavailable")


def test_the_event_layer_names_both_kinds():
    assert (EVENT_KINDS[RECOVERY], EVENT_KINDS[UNAVAILABLE]) == NEW_KINDS


def test_only_a_driver_from_r565_has_the_new_event_types():
    assert event_types(560) == 0
    assert event_types(565) == event_types(580) == RECOVERY | UNAVAILABLE


def test_a_recovery_action_raises_its_event_where_the_driver_has_it():
    fault = Fault(at=0, kind="recovery_action", device=0, params={"action": "drain_and_reset"})
    assert events_of(fault, 580) == [(XID, 154), (RECOVERY, pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET)]
    assert events_of(fault, 560) == [(XID, 154)]  # the action field came with R565 too: XID 154 alone


def test_a_gpu_unavailable_fault_raises_its_event_where_the_driver_has_it():
    fault = Fault(at=0, kind="gpu_unavailable", device=0)
    assert events_of(fault, 580) == [(UNAVAILABLE, 0)]
    assert events_of(fault, 560) == []


def test_other_faults_raise_what_they_did():
    storm = Fault(at=0, kind="xid", device=0, params={"xid": 13, "count": 3})
    assert events_of(storm) == events_of(storm, 550) == [(XID, 13)] * 3
    assert events_of(Fault(at=0, kind="thermal_slowdown", device=0)) == []


def gpu(**metrics) -> Device:
    return Device(index=0, uuid="GPU-0", name="NVIDIA B200", metrics=dict(metrics))


def event(kind: str, code: int = 0) -> Event:
    return Event(device_uuid="GPU-0", kind=kind, code=code, timestamp=1.0)


def test_an_unavailable_gpu_is_critical_and_held_until_a_reset():
    found = health.evaluate(gpu(), None, [event("gpu_unavailable")])
    assert found.status is Status.CRITICAL
    assert found.message.startswith("the GPU is unavailable: ")
    assert found.holdable[health.UNAVAILABLE][:3] == (Status.CRITICAL, found.message, True)


def test_a_recovery_action_event_adds_no_reason_of_its_own():
    # The recovery action field is read every run: it, not the event, says what the driver asks now.
    quiet = health.evaluate(gpu(), None, [event("recovery_action", pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)])
    assert (quiet.status, quiet.reasons, quiet.holdable) == (Status.OK, [], {})


def test_a_storm_is_one_reason_with_its_count():
    storm = health.evaluate(gpu(), None, [event("xid", 13)] * 5000 + [event("ecc_dbe")] * 3)
    assert storm.reasons[0].startswith("XID 13 × 5,000 (Graphics engine exception): Restart the application")
    assert storm.reasons[1:] == ["double-bit ECC error event"]


def test_the_snapshot_and_the_journal_carry_the_new_kinds(tmp_path):
    raw = [RawEvent(UNREGISTERED, kind, 4, None, None, 1.0) for kind in NEW_KINDS]
    with Journal(str(tmp_path)) as journal:
        for one in raw:
            journal.append(one.record())
        records = journal.read(0, 10).records
    events = [load(Event, record, f"events[{i}]") for i, record in enumerate(records)]
    assert [(e.kind, e.code) for e in events] == [(kind, 4) for kind in NEW_KINDS]
    snapshot = Snapshot.from_json(Snapshot(timestamp=1.0, node=Node(), devices=[gpu()], events=events).to_json())
    assert [e.kind for e in snapshot.events] == list(NEW_KINDS)
