"""One XID counted once whichever source saw it: NVML's event and the kernel's line paired by GPU, code
and time, in one run or across two; what one source missed counted from the other."""

from gpu_monitoring.health.xid_join import WINDOW, XidJoin
from gpu_monitoring.snapshot import Event

UUID = "GPU-509665ad-6b2a-2a1d-4e2e-9d6c6c1e7f11"
NVML_BUS = "00000000:9B:00.0"
KERNEL_BUS = "00000000:9B:00.0"  # the kernel's `PCI:0000:9b:00`, in NVML's form as node.kernel_events writes it


def nvml(code, at, bus=NVML_BUS, **more):
    return Event(UUID, "xid", code, at, device_index=3, pci_bus_id=bus, **more)


def kernel(code, at, **more):
    return Event(None, "xid", code, at, pci_bus_id=KERNEL_BUS, source="kernel", pid=4711, process_name="python",
                 detail="Graphics Exception", **more)


def test_the_same_xid_from_both_sources_in_one_run_is_one_event_with_what_each_knows():
    (xid,) = XidJoin().join([nvml(13, 1005.0, gpu_instance_id=2), kernel(13, 1000.0)], now=1005.0)
    assert (xid.code, xid.source, xid.pid, xid.process_name, xid.device_uuid, xid.gpu_instance_id) == (
        13, "nvml", 4711, "python", UUID, 2)
    assert xid.timestamp == 1000.0  # the kernel's own time


def submitted(join, events, now):
    """One run: its events joined, then submitted."""
    kept = join.join(events, now)
    join.commit()
    return kept


def test_a_pair_split_over_two_runs_is_counted_in_the_first():
    join = XidJoin()
    assert len(submitted(join, [kernel(13, 1000.0)], now=1000.0)) == 1
    assert submitted(join, [nvml(13, 1014.0)], now=1014.0) == []
    # ...and kept across a restart of the check.
    join = XidJoin()
    submitted(join, [nvml(31, 2000.0)], now=2000.0)
    restarted = XidJoin.loads(join.dumps())
    assert restarted.join([kernel(31, 1999.5)], now=2010.0) == []


def test_a_run_that_failed_to_submit_remembers_nothing():
    join = XidJoin()
    join.join([kernel(79, 1000.0), kernel(13, 1000.0)], now=1000.0)  # the run fails: never committed
    # The next run is handed the same events again: counted, once.
    assert len(submitted(join, [kernel(79, 1000.0), kernel(13, 1000.0)], now=1015.0)) == 2
    assert submitted(join, [kernel(79, 1001.0), nvml(13, 1016.0)], now=1016.0) == []


def test_what_one_source_missed_is_counted_from_the_other():
    join = XidJoin()
    # The ring wrapped in a storm: NVML has 5 XIDs, the kernel's log kept the last 2.
    events = [nvml(13, 1010.0) for _ in range(5)] + [kernel(13, 1003.0), kernel(13, 1004.0)]
    kept = submitted(join, events, now=1010.0)
    assert len(kept) == 5
    assert sum(e.pid == 4711 for e in kept) == 2
    # The sidecar was down: only the kernel saw these.
    assert len(submitted(join, [kernel(43, 1100.0), kernel(43, 1101.0)], now=1110.0)) == 2


def test_xids_too_far_apart_are_two():
    join = XidJoin()
    assert len(submitted(join, [kernel(13, 1000.0)], now=1000.0)) == 1
    assert len(submitted(join, [nvml(13, 1000.0 + WINDOW + 60)], now=1000.0 + WINDOW + 60)) == 1


def test_other_gpus_and_codes_do_not_pair():
    kept = XidJoin().join([kernel(13, 1000.0), nvml(31, 1001.0), nvml(13, 1001.0, bus="00000000:18:00.0")], 1001.0)
    assert len(kept) == 3


def test_a_gpu_fallen_off_the_bus_is_one_xid_79_however_it_is_told():
    join = XidJoin()
    told = [kernel(79, 1000.0), kernel(79, 1000.1, implied=True), nvml(79, 1003.0)]
    (xid,) = submitted(join, told, now=1003.0)
    assert xid.code == 79 and xid.device_uuid == UUID
    # The driver repeats its fall-off message whenever the GPU is opened: still the same fault.
    assert submitted(join, [kernel(79, 1500.0, implied=True)], now=1500.0) == []


def test_events_that_are_not_xids_pass_untouched():
    aer = Event(None, "aer", 0, 1000.0, pci_bus_id=KERNEL_BUS, source="kernel", severity="corrected")
    dbe = Event(UUID, "ecc_dbe", 0, 1000.0, pci_bus_id=NVML_BUS)
    assert XidJoin().join([aer, dbe], now=1000.0) == [aer, dbe]


def test_an_unreadable_memory_starts_empty():
    assert XidJoin.loads("{not json").join([kernel(13, 1.0)], now=1.0)
    assert XidJoin.loads('{"unpaired": [["x", "y"]]}').join([kernel(13, 1.0)], now=1.0)
