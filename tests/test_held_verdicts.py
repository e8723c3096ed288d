"""Verdicts that ask for an action are held until evidence of the fix: each kind of evidence, time,
escalation, and the form kept in the persistent cache."""

import pytest

from gpu_monitoring.health.device_health import SINCE_LAST_RUN, Health
from gpu_monitoring.health.held_verdicts import NODE, HeldVerdicts
from gpu_monitoring.snapshot import Device
from gpu_monitoring.status import Status

DAY = 86400.0
UUID = "GPU-5d2c7b1e-0c1f-4b8e-9a43-1f0e2f6c9a10"
DBE_REASON = "double-bit ECC error event"


def gpu(energy=5000.0, ecc=0.0, recovery_action=None):
    return Device(index=0, uuid=UUID, recovery_action=recovery_action,
                  metrics={"energy.consumed": energy, "ecc.errors.uncorrected": ecc, "ecc.errors.corrected": 0.0})


def dbe() -> Health:
    health = Health()
    health.add(Status.CRITICAL, DBE_REASON, hold="dbe", reset=True)
    return health


def judged(held, device, now, health=None) -> Health:
    health = health or Health()
    held.judge_gpu(device, health, now)
    return health


def test_a_double_bit_error_stays_critical_on_later_runs_with_when_it_began():
    held = HeldVerdicts(DAY)
    first = judged(held, gpu(energy=5000, ecc=2), 1000.0, dbe())
    assert first.status is Status.CRITICAL and first.reasons == [DBE_REASON]
    for now, energy in ((1015.0, 5100), (1030.0, 5200)):
        later = judged(held, gpu(energy=energy, ecc=2), now)
        assert later.status is Status.CRITICAL
        assert later.reasons == [f"{DBE_REASON} (held since 1970-01-01 00:16:40 UTC: until the GPU is reset, "
                                 "the driver reloaded or the node rebooted)"]
    assert held.held_count == 1


@pytest.mark.parametrize("after", [gpu(energy=10.0, ecc=2), gpu(energy=9000.0, ecc=0)],
                         ids=["energy counter restarted", "volatile ECC counts restarted"])
def test_a_driver_reload_clears_it(after):
    held = HeldVerdicts(DAY)
    judged(held, gpu(energy=5000, ecc=2), 1000.0, dbe())
    judged(held, gpu(energy=5100, ecc=2), 1015.0)
    assert judged(held, after, 1030.0).status is Status.OK
    assert held.held_count == 0


def test_a_lost_gpu_that_reads_no_counter_keeps_its_hold():
    held = HeldVerdicts(DAY)
    judged(held, gpu(energy=5000, ecc=2), 1000.0, dbe())
    lost = Device(index=0, uuid=UUID, lost=True)
    assert judged(held, lost, 1015.0).status is Status.CRITICAL
    assert judged(held, gpu(energy=5200, ecc=2), 1030.0).status is Status.CRITICAL


def test_a_reboot_clears_every_hold_of_the_node():
    held = HeldVerdicts(DAY)
    held.booted("boot-a")
    judged(held, gpu(), 1000.0, dbe())
    flap = Health()
    flap.add(Status.WARNING, "port mlx5_1/1 flapped", hold="flap:mlx5_1/1")
    held.judge_node(flap, 1000.0)
    held.booted("boot-a")
    assert judged(held, gpu(), 1015.0).status is Status.CRITICAL
    held.booted("boot-b")
    node = Health()
    held.judge_node(node, 1030.0)
    assert judged(held, gpu(energy=6000), 1030.0).status is Status.OK and node.status is Status.OK


def test_the_recovery_action_reading_none_again_clears_it():
    held = HeldVerdicts(DAY)
    asked = Health()
    asked.add(Status.CRITICAL, "the driver asks for recovery action gpu reset", hold="recovery", reset=True)
    judged(held, gpu(recovery_action=1), 1000.0, asked)
    assert judged(held, gpu(recovery_action=1, energy=5100), 1015.0).status is Status.CRITICAL
    assert judged(held, gpu(recovery_action=0, energy=5200), 1030.0).status is Status.OK


def test_a_recovery_action_that_never_asked_is_no_evidence():
    held = HeldVerdicts(DAY)
    judged(held, gpu(recovery_action=0), 1000.0, dbe())
    assert judged(held, gpu(recovery_action=0, energy=5100), 1015.0).status is Status.CRITICAL


def test_fault_hold_passing_clears_it():
    held = HeldVerdicts(100.0)
    judged(held, gpu(), 1000.0, dbe())
    assert judged(held, gpu(energy=5100), 1099.0).status is Status.CRITICAL
    assert judged(held, gpu(energy=5200), 1100.0).status is Status.OK


def test_with_fault_hold_0_nothing_outlives_its_run_and_a_lasting_verdict_counts_once():
    held = HeldVerdicts(0.0)
    for now in (1000.0, 1015.0, 1030.0):
        judged(held, gpu(), now, dbe())
    assert judged(held, gpu(energy=5100), 1045.0).status is Status.OK
    assert held.records[UUID].resets == [1000.0]


def test_a_gpu_reset_three_times_in_a_week_escalates_until_the_oldest_is_a_week_old():
    held = HeldVerdicts(DAY)
    energy = 5000.0
    for day in range(3):
        judged(held, gpu(energy=energy), day * DAY, dbe())
        energy = 10.0  # the driver reloaded: the hold is fixed before the next error
        judged(held, gpu(energy=energy), day * DAY + 60)
        energy = 20.0
    escalated = judged(held, gpu(energy=30.0), 2 * DAY + 120)
    assert escalated.status is Status.CRITICAL
    assert escalated.reasons == ["needed a reset 3 times in 7 days: take it out of service and open a support case"]
    assert held.escalated_count == 1
    assert judged(held, gpu(energy=40.0), 7 * DAY + 1).status is Status.OK
    assert held.escalated_count == 0


def test_a_verdict_that_needs_no_reset_is_held_but_does_not_escalate():
    held = HeldVerdicts(DAY)
    for day in range(4):
        drain = Health()
        drain.add(Status.WARNING, "drain peer-to-peer traffic", hold="recovery", reset=False)
        judged(held, gpu(recovery_action=3), day * DAY, drain)
        judged(held, gpu(recovery_action=0, energy=5100), day * DAY + 60)
    assert held.escalated_count == 0


def test_the_node_holds_a_flap_until_the_hold_passes():
    held = HeldVerdicts(100.0)
    flap = Health()
    flap.add(Status.WARNING, "port mlx5_1/1 flapped", hold="flap:mlx5_1/1")
    held.judge_node(flap, 1000.0)
    later = Health()
    held.judge_node(later, 1050.0)
    assert later.status is Status.WARNING
    assert later.reasons[0].startswith("port mlx5_1/1 flapped (held since")
    assert "until the node reboots or fault_hold passes" in later.reasons[0]
    gone = Health()
    held.judge_node(gone, 1100.0)
    assert gone.status is Status.OK and NODE not in held.records


def test_what_is_held_survives_a_restart_through_the_persistent_cache():
    held = HeldVerdicts(DAY)
    held.booted("boot-a")
    judged(held, gpu(energy=5000, ecc=2), 1000.0, dbe())
    restored = HeldVerdicts.loads(held.dumps(), DAY)
    restored.booted("boot-a")
    assert judged(restored, gpu(energy=5100, ecc=2), 1015.0).status is Status.CRITICAL
    restored.booted("boot-b")
    assert judged(restored, gpu(energy=5200, ecc=2), 1030.0).status is Status.OK


@pytest.mark.parametrize("text", [None, "", "not json", "[]", '{"records": {"x": {"held": 5}}}', '{"records": 3}'])
def test_an_unreadable_cache_holds_nothing(text):
    held = HeldVerdicts.loads(text, DAY)
    assert held.records == {} and held.boot_id is None


def test_a_gpu_no_longer_listed_is_forgotten():
    held = HeldVerdicts(DAY)
    judged(held, gpu(), 1000.0, dbe())
    held.forget_others(["GPU-another"])
    assert held.records == {}


def test_a_held_reason_says_when_not_since_the_last_run():
    """A flap told "since the last run" is held in words true on every later run: what happened, and when."""
    held = HeldVerdicts(3600.0)
    flap = Health()
    flap.add(Status.WARNING, f"port mlx5_1/1 flapped: its link went down 1 time{SINCE_LAST_RUN}",
             hold="flap:mlx5_1/1")
    held.judge_node(flap, 1000.0)
    for now in (1015.0, 1900.0):
        later = Health()
        held.judge_node(later, now)
        assert later.reasons == ["port mlx5_1/1 flapped: its link went down 1 time (held since 1970-01-01 00:16:40 "
                                 "UTC: until the node reboots or fault_hold passes)"]
