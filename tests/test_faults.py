"""A bad afternoon on six H100 PCIe (scenario faults): XIDs, a lost GPU, ECC, heat, links, a driver reload.

Timeline: at t=20 XID 13 on GPU 1; XID 79 on GPU 2, lost until t=80; 2 uncorrectable ECC errors
on GPU 3; thermal slowdown on GPU 4 until t=80; a row remap pending and XID 63 on GPU 5. From
t=50 to t=80 NVLink 3 of GPU 0 is down and its PCIe link trains at Gen4 x8. At t=110 the
driver is reloaded. The check runs every 15 s from t=0.
"""

import logging

import pytest
from datadog_checks.base import AgentCheck

from gpu_monitoring.collectors.node_reader import NodeReader
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import load as load_scenario

from .conftest import H100_PCIE_NODE, tag_dict

GPUS = range(6)
OK, WARNING, CRITICAL = AgentCheck.OK, AgentCheck.WARNING, AgentCheck.CRITICAL


@pytest.fixture
def faults(node):
    return node("faults")


def test_clean_before_the_faults(faults, aggregator):
    faults.run()
    assert faults.statuses() == dict.fromkeys(GPUS, OK)
    faults.run()
    assert faults.statuses() == dict.fromkeys(GPUS, OK)
    assert aggregator.events == []
    assert faults.series("xid_errors") == []


def test_health_when_the_faults_hit(faults):
    faults.run_until(30)
    health = faults.health()
    assert {i: s.status for i, s in health.items()} == {
        0: OK, 1: WARNING, 2: CRITICAL, 3: CRITICAL, 4: WARNING, 5: WARNING,
    }
    assert "XID 13" in health[1].message and "Restart the application" in health[1].message
    assert "GPU lost" in health[2].message and "XID 79" in health[2].message
    assert "uncorrectable ECC" in health[3].message and "2 uncorrectable" in health[3].message
    assert "thermal slowdown" in health[4].message
    assert "row remap pending" in health[5].message
    assert not health[0].message


def test_lost_gpu_is_critical_while_the_others_report(faults, aggregator):
    faults.run_until(30)
    # GPU 2 fell off the bus: its health says so and it submits no readings...
    assert faults.statuses()[2] == CRITICAL
    for metric in ("temperature", "utilization.gpu", "memory.used", "power.usage", "clock.sm"):
        assert set(faults.values(metric)) == {0, 1, 3, 4, 5}, metric
    # ...but it is still counted and still named by its tags.
    aggregator.assert_metric("gpu_monitoring.devices.count", value=6)
    lost = faults.health()[2]
    assert tag_dict(lost.tags)["gpu_device"] == "nvidia_h100_pcie"
    assert tag_dict(lost.tags)["gpu_uuid"].startswith("gpu-")
    assert faults.values("utilization.gpu")[1] > 50


def test_xid_events(faults, aggregator):
    faults.run_until(30)
    events = {tag_dict(e["tags"])["xid"]: e for e in aggregator.events}
    assert set(events) == {"13", "63", "79"}
    lost = events["79"]
    assert lost["alert_type"] == "error"
    assert "XID 79 on GPU 2" in lost["msg_title"]
    assert "fallen off the bus" in lost["msg_title"]
    assert "reboot" in lost["msg_text"]
    assert tag_dict(lost["tags"])["gpu_index"] == "2"
    assert events["13"]["alert_type"] == "warning"
    assert tag_dict(events["13"]["tags"])["gpu_index"] == "1"
    # XID 63 (a row remap was recorded) is information; the pending remap itself is the warning.
    assert events["63"]["alert_type"] == "info"
    # Events are sent once, in the run that sees them.
    faults.run()
    assert aggregator.events == []


def test_xid_counts(faults, aggregator):
    faults.run_until(30)
    counts = {}
    for stub in faults.series("xid_errors"):
        assert stub.type == aggregator.COUNT
        tags = tag_dict(stub.tags)
        counts[(int(tags["gpu_index"]), tags["xid"], tags["xid_origin"], tags["xid_action"])] = stub.value
    assert counts == {
        (1, "13", "application", "restart_app"): 1,
        (2, "79", "bus", "reboot_node"): 1,
        # XID 63 itself calls for nothing (NVIDIA's catalog); the pending remap's health reason asks for the reset.
        (5, "63", "memory", "none"): 1,
    }
    # The lost GPU's count carries all its device tags, as its health check does.
    aggregator.assert_metric(
        "gpu_monitoring.xid_errors", value=1, count=1, metric_type=aggregator.COUNT,
        tags=faults.health()[2].tags + ["xid:79", "xid_origin:bus", "xid_action:reboot_node"],
    )
    faults.run()
    assert faults.series("xid_errors") == []


def test_uncorrectable_ecc(faults, aggregator):
    faults.run_until(30)
    assert faults.values("ecc.errors.uncorrected")[3] == 2
    assert {s.type for s in faults.series("ecc.errors.uncorrected")} == {aggregator.MONOTONIC_COUNT}
    assert faults.statuses()[3] == CRITICAL


def test_thermal_slowdown(faults):
    faults.run_until(30)
    assert faults.values("clocks_event.hw_thermal_slowdown")[4] == 1
    assert faults.values("clocks_event.sw_thermal_slowdown")[4] == 1
    assert faults.values("throttled")[4] == 1
    assert faults.values("throttled")[0] == 0
    assert faults.values("temperature")[4] >= faults.values("temperature.slowdown_threshold")[4] == 88
    # Slowed clocks: GPU 4 runs the same load as GPU 0 at a lower SM clock.
    assert faults.values("clock.sm")[4] < faults.values("clock.sm")[0]
    assert faults.statuses()[4] == WARNING


def test_remap_pending(faults):
    faults.run_until(30)
    assert faults.values("remapped_rows.pending")[5] == 1
    assert faults.values("remapped_rows.uncorrectable")[5] == 1
    assert faults.values("remapped_rows.failed")[5] == 0
    assert faults.statuses()[5] == WARNING


def test_ignored_xid_leaves_the_gpu_ok(node, aggregator):
    faults = node("faults", xid_ignore=[13]).run_until(30)
    statuses = faults.statuses()
    assert statuses[1] == OK
    assert not faults.health()[1].message
    # Other XIDs still change health.
    assert statuses[2] == CRITICAL
    # An ignored XID is still counted and still sent as an event.
    assert {tag_dict(s.tags)["xid"]: s.value for s in faults.series("xid_errors")} == {"13": 1, "63": 1, "79": 1}
    assert sorted(tag_dict(e["tags"])["xid"] for e in aggregator.events) == ["13", "63", "79"]


def test_temperature_margin_option(node):
    # At t=0 the GPUs run at about 40 degrees C and slow down at 88: with a 50 degree margin all are "near".
    faults = node("faults", temperature_margin=50).run()
    for index, stub in faults.health().items():
        temperature = faults.values("temperature")[index]
        assert 38 <= temperature < 48
        assert stub.status == WARNING
        assert stub.message == f"temperature {temperature:.0f}°C is within 50°C of the slowdown threshold 88°C"


def test_nvlink_down_and_pcie_degraded(faults):
    faults.run_until(60)
    assert faults.values("nvlink.links.active")[0] == 11
    assert faults.values("nvlink.links.active")[1] == 12
    assert faults.values("pcie.link.generation")[0] == 4
    assert faults.values("pcie.link.width")[0] == 8
    assert faults.values("pcie.link.generation.max")[0] == 5
    assert faults.values("pcie.link.width.max")[0] == 16
    gpu0 = faults.health()[0]
    assert gpu0.status == WARNING
    assert "NVLink down: link 3" in gpu0.message
    assert "Gen4 x8" in gpu0.message and "Gen5 x16" in gpu0.message
    # The link going down counted errors.
    assert faults.values("nvlink.errors.crc_flit")[0] == 1


def test_conditions_clear(faults):
    faults.run_until(90)
    statuses = faults.statuses()
    # The link, PCIe and thermal conditions ended at t=80; the remap still waits for a reset.
    assert statuses[0] == OK
    assert statuses[4] == OK
    assert statuses[5] == WARNING
    assert faults.values("nvlink.links.active")[0] == 12
    assert faults.values("pcie.link.width")[0] == 16
    assert faults.values("clocks_event.hw_thermal_slowdown")[4] == 0


def test_lost_gpu_recovers(faults):
    faults.run_until(75)
    assert faults.statuses()[2] == CRITICAL
    assert 2 not in faults.values("temperature")
    faults.run()  # t=90: the GPU is back, and reads again; its XID 79 asked for a reboot, which has not been
    health = faults.health()[2]
    assert health.status == CRITICAL
    assert health.message.startswith("XID 79 (GPU has fallen off the bus)") and "(held since " in health.message
    for metric in ("temperature", "utilization.gpu", "memory.used", "power.usage", "clock.sm", "energy.consumed",
                   "nvlink.links.active"):
        assert 2 in faults.values(metric), metric
    assert faults.values("memory.used")[2] == 30000 * 1024 * 1024
    assert 50 <= faults.values("utilization.gpu")[2] <= 70
    assert faults.values("nvlink.links.active")[2] == 12
    faults.run_until(120)  # the driver was reloaded at t=110: the hold is fixed
    assert faults.health()[2].status == OK


def test_lost_gpu_keeps_its_identity_across_nvml_restarts():
    # While a GPU stays lost, the node reader restarts NVML every `lost_restart_interval` seconds
    # (300 by default; 0 here so that every run after the loss restarts). The GPU is still the same
    # GPU: its UUID, name and PCI bus id (and so its tags) must not be forgotten by the restart.
    sim = SimulatedNvml(load_scenario("faults"), SimClock(speed=0))
    reader = NodeReader(NvmlSession(sim.library), lost_restart_interval=0)
    try:
        snapshots = []
        for run in range(5):  # t = 0, 15, 30, 45, 60
            if run:
                sim.advance(15)
            snapshots.append(reader.read())
    finally:
        reader.close()
    healthy, lost_at_30, lost_at_45, lost_at_60 = (s.devices[2] for s in snapshots[1:])
    assert sim.calls["nvmlInitWithFlags"] > 1, "NVML was not restarted while the GPU stayed lost"
    assert not healthy.lost and lost_at_30.lost and lost_at_45.lost and lost_at_60.lost
    for lost in (lost_at_30, lost_at_45, lost_at_60):
        assert (lost.uuid, lost.name, lost.pci_bus_id, lost.architecture) == (
            healthy.uuid, healthy.name, healthy.pci_bus_id, healthy.architecture
        )
    # The other GPUs are read as usual.
    assert [d.lost for d in snapshots[-1].devices] == [False, False, True, False, False, False]


def test_driver_reload(faults, caplog):
    faults.run_until(105)
    before = faults.sim.calls["nvmlInitWithFlags"]
    caplog.set_level(logging.INFO)
    faults.run()  # t=120, after the reload at t=110
    assert faults.sim.calls["nvmlInitWithFlags"] == before + 1
    for metric in ("temperature", "utilization.gpu", "memory.used", "power.usage", "energy.consumed"):
        assert set(faults.values(metric)) == set(GPUS), metric
    assert len(faults.health()) == 6
    assert faults.statuses()[0] == OK
    assert any("starting it again" in r.getMessage() for r in caplog.records)
    faults.run()  # and the run after that is an ordinary one
    assert faults.sim.calls["nvmlInitWithFlags"] == before + 1
    assert set(faults.values("temperature")) == set(GPUS)
    assert set(faults.values("sm_active")) == set(GPUS)
    assert faults.sim.failures == []


MORE_FAULTS = H100_PCIE_NODE + """
description: Six H100 PCIe with the faults the faults scenario does not have.
devices:
  - {model: h100, load: {utilization: 50}}
  - {model: h100, load: {utilization: 50}}
  - {model: h100, load: {utilization: 50}}
  - {model: h100, load: {utilization: 50}}
  - {model: h100, mig: [{profile: 3g.40gb, gi: 1, memory_mib: 40192, utilization: 80}]}
  - {model: h100, load: {utilization: 50}}
faults:
  - {at: 0, kind: gpu_lost, device: 5, duration: 20}
  - {at: 20, kind: power_brake, device: 0, duration: 30}
  - {at: 20, kind: remap_failure, device: 1}
  - {at: 20, kind: retired_pending, device: 2}
  - {at: 20, kind: ecc_sbe, device: 3, count: 5}
  - {at: 20, kind: xid, device: 4, xid: 31, gpu_instance: 1}
  - {at: 35, kind: driver_reload}
  - {at: 50, kind: xid, device: 0, xid: 48}
"""


@pytest.fixture
def more_faults(node, tmp_path):
    scenario = tmp_path / "more-faults.yaml"
    scenario.write_text(MORE_FAULTS)
    return node(scenario)


def test_gpu_lost_before_it_was_ever_read(more_faults, aggregator):
    more_faults.run()
    health = more_faults.health()
    assert health[5].status == CRITICAL
    assert "GPU lost" in health[5].message
    # NVML could read nothing from it, not even its UUID: the driver's record names it. The others are read.
    assert tag_dict(health[5].tags)["gpu_uuid"] == more_faults.sim.devices[5].spec.uuid.lower()
    assert set(more_faults.values("temperature")) == {0, 1, 2, 3, 4}
    aggregator.assert_metric("gpu_monitoring.devices.count", value=6)
    more_faults.run_until(30)
    assert more_faults.statuses()[5] == OK
    assert tag_dict(more_faults.health()[5].tags)["gpu_uuid"].startswith("gpu-")
    assert 5 in more_faults.values("temperature")


def test_more_health_rules(more_faults):
    more_faults.run_until(30)
    health = more_faults.health()
    assert {i: s.status for i, s in health.items()} == {
        0: WARNING, 1: CRITICAL, 2: CRITICAL, 3: OK, 4: WARNING, 5: OK,
    }
    assert "power-brake" in health[0].message
    assert more_faults.values("clocks_event.hw_power_brake_slowdown")[0] == 1
    assert more_faults.values("throttled")[0] == 1
    assert "row remapping failed" in health[1].message
    assert more_faults.values("remapped_rows.failed")[1] == 1
    assert "page retirement pending" in health[2].message
    assert more_faults.values("retired_pages.pending")[2] == 1
    assert more_faults.values("retired_pages.double_bit")[2] == 1
    # Corrected ECC errors are counted but do not make the GPU unhealthy.
    assert more_faults.values("ecc.errors.corrected")[3] == 5
    assert "XID 31" in health[4].message


def test_xid_on_a_mig_instance(more_faults, aggregator):
    more_faults.run_until(30)
    (event,) = aggregator.events
    assert event["msg_title"].startswith("XID 31 on GPU 4")
    assert "GPU instance 1" in event["msg_text"]
    assert event["alert_type"] == "warning"
    assert "gpu_slicing_mode:mig-parent" in event["tags"]


def test_xids_after_a_driver_reload_are_still_seen(more_faults, aggregator):
    more_faults.run_until(45)  # the reload at t=35 is handled at t=45
    assert set(more_faults.values("temperature")) == set(GPUS)
    more_faults.run()  # XID 48 at t=50
    (event,) = aggregator.events
    assert event["msg_title"].startswith("XID 48 on GPU 0")
    assert event["alert_type"] == "error"
    assert more_faults.statuses()[0] == CRITICAL
