"""A GPU that fell off the bus keeps its name: its XID events, its health and its series carry its UUID,
index and PCI bus ID, however little NVML can still say of it.

Scenario faults: GPU 2 falls off the bus with XID 79 at t=20 and is back at t=80.
"""

import pytest
from datadog_checks.base import AgentCheck
from datadog_checks.base.stubs import aggregator as _aggregator

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.collectors.node_reader import NodeReader
from gpu_monitoring.node.driver_gpus import read_driver_gpus
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.proc_root import build_proc_root
from gpu_monitoring.simulator.scenario import load as load_scenario
from gpu_monitoring.snapshot import Device, Event, Node, Snapshot, load
from gpu_monitoring.submission.events import submit_xids

from .conftest import HEALTH, tag_dict
from .sidecar_support import SidecarProcess, wait_until

LOST = load_scenario("faults").devices[2]
NAMED = {"gpu_uuid": LOST.uuid.lower(), "gpu_index": "2", "gpu_pci_bus_id": LOST.pci_bus_id.lower()}


def named(tags):
    return {key: value for key, value in tag_dict(tags).items() if key in NAMED}


def xid_79():
    (event,) = [e for e in _aggregator.events if "xid:79" in e["tags"]]
    return event


def health_of_gpu_2():
    (stub,) = [s for s in _aggregator.service_checks(HEALTH) if "gpu_index:2" in s.tags]
    return stub


@pytest.fixture(scope="module")
def after_the_fall(tmp_path_factory):
    """A sidecar that journaled the XIDs of t=20, then a new one started at t=25 on the same journal,
    while GPU 2 is off the bus: NVML gives the new one no handle for it."""
    tmp_path = tmp_path_factory.mktemp("after-the-fall")
    first = SidecarProcess(tmp_path, "faults", "--start-at", "15", "--speed", "2").start()
    try:
        wait_until(lambda: len(first.journaled()) >= 4, 20, "the XIDs of t=20 never reached the journal")
    finally:
        assert first.stop() == 0
    second = SidecarProcess(tmp_path, "faults", "--start-at", "25").start()
    yield second
    second.stop()


def test_a_sidecar_started_after_the_fall_journals_and_serves_gpu_2s_name(after_the_fall):
    client = after_the_fall.client()
    (record,) = [e for e in after_the_fall.journaled() if e.code == 79]
    assert (record.device_uuid, record.device_index, record.pci_bus_id) == (LOST.uuid, 2, LOST.pci_bus_id)
    # The kernel told of the fall too, in the driver's three lines without an Xid line; read once, by the
    # first sidecar: the second goes on from where it stopped.
    (told,) = [e for e in after_the_fall.journaled("kernel") if e.code == 79]
    assert told.implied and told.pci_bus_id == LOST.pci_bus_id
    lost = client.snapshot().devices[2]
    assert lost.lost and "no handle" in lost.error
    # NVML cannot name it; the driver's record under the proc root does.
    assert (lost.uuid, lost.name, lost.pci_bus_id, lost.minor_number) == (
        LOST.uuid, LOST["name"], LOST.pci_bus_id, 2)


def test_a_sidecar_mode_check_names_gpu_2_in_its_xid_and_health(after_the_fall, aggregator, datadog_agent):
    check = GpuMonitoringCheck("gpu_monitoring", {}, [
        {"source": "sidecar", "sidecar_socket": after_the_fall.socket, "kubernetes": False}])
    assert check.run() == ""
    event = xid_79()
    assert named(event["tags"]) == NAMED
    assert event["msg_title"].startswith("XID 79 on GPU 2")
    health = health_of_gpu_2()
    assert health.status == AgentCheck.CRITICAL and "XID 79" in health.message
    assert named(health.tags) == NAMED


def test_local_mode_names_gpu_2(node, aggregator):
    node("faults").run_until(30)
    assert named(xid_79()["tags"]) == NAMED
    assert xid_79()["msg_title"].startswith("XID 79 on GPU 2 (NVIDIA H100 PCIe)")
    assert named(health_of_gpu_2().tags) == NAMED
    assert "XID 79" in health_of_gpu_2().message


def identity(tags):
    """What names the GPU and its kind: the tags a lost GPU must keep."""
    return {key: value for key, value in tag_dict(tags).items()
            if key in {*NAMED, "gpu_device", "gpu_architecture", "gpu_driver_version"}}


def test_a_sidecar_asked_first_after_the_fall_tags_gpu_2_as_local_mode_does(node, aggregator, datadog_agent,
                                                                              tmp_path):
    node("faults").run_until(30)
    local = identity(health_of_gpu_2().tags), identity(xid_79()["tags"])
    assert local[0]["gpu_architecture"] == LOST["architecture"].lower() and local[0] == local[1]
    # The sidecar starts while GPU 2 is still on the bus; the check's first snapshot comes after its fall.
    sidecar = SidecarProcess(tmp_path, "faults", "--start-at", "10", "--speed", "5").start()
    check = GpuMonitoringCheck("gpu_monitoring", {}, [
        {"source": "sidecar", "sidecar_socket": sidecar.socket, "kubernetes": False}])
    check.check_id = "sidecar"  # another instance: its persistent cache is not the local check's
    try:
        wait_until(lambda: len(sidecar.journaled()) >= 4, 20, "the XIDs of t=20 never reached the journal")
        aggregator.reset()
        assert check.run() == ""
    finally:
        check.cancel()
        sidecar.stop()
    assert health_of_gpu_2().status == AgentCheck.CRITICAL
    assert (identity(health_of_gpu_2().tags), identity(xid_79()["tags"])) == local


def test_nvml_started_after_the_fall_names_the_gpu_from_the_driver(tmp_path):
    sim = SimulatedNvml(load_scenario("faults"), SimClock(speed=0, start=25))
    proc_root = build_proc_root(tmp_path / "proc", [], sim.scenario.devices)
    reader = NodeReader(NvmlSession(sim.library), proc_root=str(proc_root))
    try:
        devices = reader.read().devices
    finally:
        reader.close()
    assert devices[2].lost and (devices[2].uuid, devices[2].pci_bus_id) == (LOST.uuid, LOST.pci_bus_id)
    assert [d.uuid for d in devices] == [spec.uuid for spec in sim.scenario.devices]


def test_the_driver_record_names_no_gpu_whose_order_nvml_contradicts(tmp_path):
    # GPUs whose bus IDs do not rise with their index: the index tells nothing of where a GPU without one sits.
    scenario = load_scenario("faults")
    scenario.devices[0].pci_bus_id, scenario.devices[1].pci_bus_id = (
        scenario.devices[1].pci_bus_id, scenario.devices[0].pci_bus_id)
    sim = SimulatedNvml(scenario, SimClock(speed=0, start=25))
    proc_root = build_proc_root(tmp_path / "proc", [], scenario.devices)
    assert len(read_driver_gpus(str(proc_root))) == 6
    reader = NodeReader(NvmlSession(sim.library), proc_root=str(proc_root))
    try:
        lost = reader.read().devices[2]
    finally:
        reader.close()
    assert lost.lost and lost.uuid is None and lost.pci_bus_id is None


def test_no_driver_record_without_the_driver(tmp_path):
    assert read_driver_gpus(str(tmp_path)) == []
    assert read_driver_gpus(None) == []


# --- events the snapshot has no GPU for ------------------------------------------------------------


def snapshot_with(events, devices=()):
    return Snapshot(timestamp=0.0, node=Node(), devices=list(devices), events=events)


def xid(device_uuid=None, **identity):
    return Event(device_uuid=device_uuid, kind="xid", code=79, timestamp=1.0, **identity)


def test_an_event_for_a_gpu_the_snapshot_lacks_carries_its_own_name(aggregator):
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{"kubernetes": False}])
    event = xid(device_uuid=LOST.uuid, device_index=2, pci_bus_id=LOST.pci_bus_id)
    submit_xids(check, snapshot_with([event]), {}, ["team:ml"])
    (sent,) = aggregator.events
    assert named(sent["tags"]) == NAMED and "team:ml" in sent["tags"]
    assert sent["msg_title"].startswith("XID 79 on GPU 2:")
    (count,) = aggregator.metrics("gpu_monitoring.xid_errors")
    assert named(count.tags) == NAMED


def test_an_event_from_an_older_sidecar_names_its_gpu_by_uuid_alone(aggregator):
    old_record = {"seq": 7, "device_uuid": LOST.uuid, "kind": "xid", "code": 79, "timestamp": 1.0,
                  "gpu_instance_id": None, "compute_instance_id": None}
    event = load(Event, old_record, "events[0]")
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{"kubernetes": False}])
    submit_xids(check, snapshot_with([event]), {}, [])
    (sent,) = aggregator.events
    assert named(sent["tags"]) == {"gpu_uuid": NAMED["gpu_uuid"]}
    assert f"UUID {LOST.uuid}" in sent["msg_text"]


def test_which_gpu_an_event_is_about():
    named_gpu = Device(index=0, uuid="GPU-a", pci_bus_id="00000000:18:00.0")
    unnamed_at_bus = Device(index=1, uuid=None, pci_bus_id="00000000:28:00.0")
    unnamed = Device(index=2, uuid=None)
    snapshot = snapshot_with([], [named_gpu, unnamed_at_bus, unnamed])
    assert snapshot.device_of(xid(device_uuid="GPU-a", device_index=5)) is named_gpu
    assert snapshot.device_of(xid(device_uuid="GPU-b", pci_bus_id="00000000:28:00.0")) is unnamed_at_bus
    assert snapshot.device_of(xid(device_uuid="GPU-c", device_index=2)) is unnamed
    # A GPU named otherwise is another GPU, wherever the event says it was.
    assert snapshot.device_of(xid(device_uuid="GPU-d", device_index=0)) is None
    # An event that names no GPU at all is not every unnamed GPU's.
    assert snapshot.device_of(xid()) is None
    snapshot.events = [xid(device_uuid="GPU-c", device_index=2, pci_bus_id="00000000:38:00.0")]
    snapshot.identify_from_events()
    assert (unnamed.uuid, unnamed.pci_bus_id) == ("GPU-c", "00000000:38:00.0")
    assert unnamed_at_bus.uuid is None

