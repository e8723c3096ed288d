"""Recorded dcgm-exporter pages, as its versions print them, parsed and joined to a node's GPUs."""

import math
import re

import pytest

from gpu_monitoring.dcgm.exposition import METRICS, NotAnExporterPage, dcgm_key, parse
from gpu_monitoring.dcgm.join import join, wanted
from gpu_monitoring.snapshot import Device, MigInstance, Node, Snapshot

from .dcgm_support import recorded

LINKS = {"pcie.throughput.tx", "pcie.throughput.rx", "nvlink.throughput.tx", "nvlink.throughput.rx"}


def uuids(page: bytes):
    """The GPU UUIDs a page names, in order of first appearance."""
    return list(dict.fromkeys(re.findall(rb'[uU][uU][iI][dD]="(GPU-[^"]+)"', page)).keys())


def values(page, uuid, instance=None):
    return {s.metric: s.value for s in page.samples if s.gpu_uuid == dcgm_key(uuid) and s.gpu_instance_id == instance}


def snapshot_of(*devices):
    return Snapshot(timestamp=0.0, node=Node(), devices=list(devices))


def test_a_full_page_of_eight_a100s():
    body = recorded("a100-8gpu-4.x.txt")
    page = parse(body)
    gpus = [u.decode() for u in uuids(body)]
    assert len(gpus) == 8
    first = values(page, gpus[1])
    assert set(first) == METRICS
    assert 0 < first["sm_active"] <= 100 and 0 < first["graphics_active"] <= 100
    # DCGM's ratio, as percent: the line says 0.xxxxxx.
    line = re.search(rb'DCGM_FI_PROF_SM_ACTIVE\{gpu="1",.*\} (\S+)', body)
    assert first["sm_active"] == pytest.approx(float(line.group(1)) * 100)
    assert first["pcie.throughput.tx"] > 1e9, "PCIe bytes per second are taken as they are"
    # NaN (GPU 4) and a field DCGM left out (GPU 7) give no value, never a 0.
    assert "sm_active" not in values(page, gpus[4]) and "graphics_active" not in values(page, gpus[4])
    assert "sm_occupancy" not in values(page, gpus[7]) and "sm_active" in values(page, gpus[7])
    assert all(math.isfinite(s.value) for s in page.samples)
    assert len(page.heartbeat) == 16, "the energy counter and power draw of every GPU"


def test_the_default_counters_give_no_sm_active():
    page = parse(recorded("a100-8gpu-default-4.x.txt"))
    assert {s.metric for s in page.samples} == {"graphics_active", "tensor_active", "dram_active",
                                                "pcie.throughput.tx", "pcie.throughput.rx"}


def test_only_the_wanted_metrics_are_parsed():
    page = parse(recorded("a100-8gpu-default-4.x.txt"), wanted={"graphics_active"})
    assert {s.metric for s in page.samples} == {"graphics_active"} and len(page.samples) == 8


def test_mig_instances_are_named_by_their_parent_and_gpu_instance_id():
    body = recorded("a100-mig-4.x.txt")
    page = parse(body)
    parent, plain = (u.decode() for u in uuids(body))
    assert {s.gpu_instance_id for s in page.samples if s.gpu_uuid == dcgm_key(parent)} == {2, 3, 9, 10}
    assert values(page, parent, 10)["sm_active"] == 0.0, "an idle instance reads 0, which is a value"
    assert values(page, parent, 2)["sm_active"] > values(page, parent, 9)["sm_active"]
    assert "sm_active" in values(page, plain)


def test_the_old_namespace_of_dcgm_exporter_2():
    body = recorded("t4-old-namespace-2.1.txt")
    page = parse(body)
    busy, idle = (u.decode() for u in uuids(body))
    assert set(values(page, busy)) == {"graphics_active", "tensor_active", "dram_active",
                                       "pcie.throughput.tx", "pcie.throughput.rx"}
    assert 0 < values(page, busy)["graphics_active"] < 100 and values(page, idle)["graphics_active"] == 0
    assert len(page.heartbeat) == 4, "dcgm_power_usage and dcgm_total_energy_consumption"


def test_the_newest_exporter_with_a_lower_case_hostname():
    body = recorded("l4-newest.txt")
    page = parse(body)
    busy, idle = (u.decode() for u in uuids(body))
    assert values(page, busy)["graphics_active"] > 0 and values(page, idle)["graphics_active"] == 0
    assert len(page.heartbeat) == 4, "a NaN power draw is still a line of the heartbeat"


@pytest.mark.parametrize("body", [
    b"<html><body>Welcome to nginx!</body></html>",
    b"",
    b"\x00\xff\xfe binary",
    b'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-1" 0.5\n',  # the label set is not closed
    b'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-1"} half\n',
], ids=["html", "empty", "binary", "unclosed labels", "no number"])
def test_garbage_is_no_exporter_page(body):
    with pytest.raises(NotAnExporterPage):
        parse(body)


def test_series_without_what_joins_them_are_left_out():
    page = parse(b'# a comment\nDCGM_FI_PROF_SM_ACTIVE{gpu="0"} 0.5\n'
                 b'DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-2",GPU_I_ID="x"} 0.5\n'
                 b'DCGM_FI_PROF_SM_ACTIVE{gpu="2",UUID="GPU-3"} -1\n'
                 b'DCGM_FI_PROF_SM_ACTIVE{gpu="3",UUID="GPU-4"} +Inf\n'
                 b'DCGM_FI_PROF_SM_ACTIVE_X{gpu="4",UUID="GPU-5"} 0.5\n'
                 b'DCGM_FI_PROF_SM_ACTIVE{gpu="5",UUID="GPU-6"} 1.0000002\n')
    assert [(s.gpu_uuid, s.value) for s in page.samples] == [("6", 100.0)]


@pytest.mark.parametrize("spelling", ["GPU-AB12cd34-0000", "gpu-ab12CD34-0000", "ab12cd34-0000", " GPU-ab12cd34-0000 "])
def test_uuids_join_in_either_case_with_or_without_their_prefix(spelling):
    assert dcgm_key(spelling) == "ab12cd34-0000"


def test_join_fills_gpus_and_mig_instances_by_uuid_and_gpu_instance_id():
    body = recorded("a100-mig-4.x.txt")
    parent, plain = (u.decode() for u in uuids(body))
    instances = [MigInstance(uuid=f"MIG-{gi}", gpu_instance_id=gi, compute_instance_id=0, profile=None)
                 for gi in (2, 3, 9, 10)]
    # Two compute instances of GPU instance 3 both get its values, as from GPM.
    instances.append(MigInstance(uuid="MIG-3b", gpu_instance_id=3, compute_instance_id=1, profile=None))
    mig = Device(index=0, uuid=parent.upper().replace("GPU-", "gpu-"), mig_enabled=True, mig_instances=instances)
    whole = Device(index=1, uuid=plain[4:], metrics={"pcie.throughput.tx": 5.0})
    snapshot = snapshot_of(mig, whole)
    assert join(snapshot, parse(body).samples) == {dcgm_key(parent), dcgm_key(plain)}
    assert [i.activity_source for i in instances] == ["dcgm"] * 5
    assert instances[1].metrics == instances[4].metrics and "sm_active" in instances[1].metrics
    assert not LINKS & set().union(*(i.metrics for i in instances)), "a GPU instance has no PCIe of its own"
    assert mig.activity_source is None and not mig.metrics, "DCGM reports the MIG GPU by its instances only"
    assert whole.activity_source == "dcgm" and whole.metrics["sm_active"] > 0
    assert whole.metrics["pcie.throughput.tx"] == 5.0, "NVML's throughput stands"
    assert whole.metrics["pcie.throughput.rx"] > 0, "DCGM's fills what NVML did not give"


def test_gpm_wins():
    body = recorded("a100-8gpu-4.x.txt")
    gpus = [u.decode() for u in uuids(body)]
    gpm = Device(index=0, uuid=gpus[1], metrics={"sm_active": 12.0, "graphics_active": 13.0}, activity_source="gpm")
    snapshot = snapshot_of(gpm)
    join(snapshot, parse(body).samples)
    assert gpm.metrics["sm_active"] == 12.0 and "tensor_active" not in gpm.metrics and gpm.activity_source == "gpm"
    assert gpm.metrics["nvlink.throughput.tx"] > 0, "throughput NVML did not give still comes from DCGM"


def test_another_nodes_page_names_none_of_its_gpus():
    lost = Device(index=1, uuid=[u.decode() for u in uuids(recorded("l4-newest.txt"))][0], lost=True)
    snapshot = snapshot_of(Device(index=0, uuid="GPU-00000000-0000-0000-0000-000000000000"), lost)
    assert join(snapshot, parse(recorded("l4-newest.txt")).samples) == set()
    assert not any(d.metrics for d in snapshot.devices), "a lost GPU takes nothing"


def test_throughput_is_wanted_only_where_nvml_gave_none():
    given = {m: 1.0 for m in LINKS}
    assert not wanted(snapshot_of(Device(index=0, uuid="GPU-1", metrics=given))) & LINKS
    lacking = Device(index=1, uuid="GPU-2", metrics={"pcie.throughput.tx": 1.0, "pcie.throughput.rx": 1.0})
    assert wanted(snapshot_of(lacking)) & LINKS == {"nvlink.throughput.tx", "nvlink.throughput.rx"}
    assert "sm_active" in wanted(snapshot_of())
