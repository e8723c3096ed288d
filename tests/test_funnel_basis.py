"""The funnel's basis: `effective` and each workload's idleness rest on SM activity where GPM or DCGM
gives it, then graphics-engine activity, then utilization.gpu, and the fleet series say which."""

from gpu_monitoring.attribution.pipeline import attribute
from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.health.device_health import Health
from gpu_monitoring.health.judge import NodeReport
from gpu_monitoring.health.node_health import NodeVerdict
from gpu_monitoring.snapshot import Device, MigInstance, Node, Process, Snapshot
from gpu_monitoring.submission.submitter import Submitter

from .conftest import tag_dict

NO_NODE = NodeReport(NodeVerdict(Health(), None, []), None, 0, 0)

A100 = "NVIDIA A100-SXM4-80GB"


def process(pid, sm=None, container="c0ffee"):
    return Process(pid=pid, used_memory=1 << 30, kind="compute", container_id=f"{container}{pid}", sm_utilization=sm)


def gpu(index, name="NVIDIA L4", source=None, processes=(), **metrics):
    return Device(index=index, uuid=f"GPU-{index}", name=name, metrics=metrics, activity_source=source,
                  processes=list(processes))


def mig_gpu(index, *instances):
    return Device(index=index, uuid=f"GPU-{index}", name=A100, mig_enabled=True, mig_instances=list(instances))


def instance(gi, source="dcgm", processes=(), **metrics):
    return MigInstance(uuid=f"MIG-{gi}", gpu_instance_id=gi, compute_instance_id=0, profile="1g.10gb",
                       metrics=metrics, activity_source=source, processes=list(processes))


def no_price(_model):
    return None


def attributed(*devices, threshold=50.0):
    return attribute(Snapshot(timestamp=0.0, node=Node(), devices=list(devices)), None, threshold, no_price)


def state(device):
    return attributed(device).devices[device.index].state


def test_sm_activity_from_gpm_is_the_basis():
    found = state(gpu(0, source="gpm", processes=[process(1)], sm_active=60.0, graphics_active=70.0,
                      **{"utilization.gpu": 100.0}))
    assert (found.basis, found.active, found.effective) == ("gpm", True, True)


def test_sm_activity_from_dcgm_is_the_basis_over_utilization():
    # The GPU runs a kernel all the time (utilization 100 %) but keeps few SMs busy: not effective.
    found = state(gpu(0, source="dcgm", processes=[process(1)], sm_active=20.0, graphics_active=95.0,
                      **{"utilization.gpu": 100.0}))
    assert (found.basis, found.active, found.effective) == ("dcgm", True, False)


def test_graphics_engine_activity_is_the_basis_without_sm_activity():
    # dcgm-exporter's default counters: the graphics engine's activity, no SM activity.
    busy = state(gpu(0, source="dcgm", processes=[process(1)], graphics_active=75.0, **{"utilization.gpu": 40.0}))
    assert (busy.basis, busy.effective) == ("dcgm", True)
    light = state(gpu(0, source="dcgm", processes=[process(1)], graphics_active=30.0, **{"utilization.gpu": 90.0}))
    assert (light.basis, light.effective) == ("dcgm", False)


def test_utilization_is_the_basis_where_nothing_profiles_the_gpu():
    found = state(gpu(0, processes=[process(1)], **{"utilization.gpu": 80.0}))
    assert (found.basis, found.active, found.effective) == ("utilization", True, True)


def test_a_gpu_without_activity_source_had_its_activity_from_gpm():
    # A sidecar older than `activity_source` sent GPM's values without saying so.
    assert state(gpu(0, processes=[process(1)], sm_active=80.0)).basis == "gpm"


def test_a_mig_gpu_is_effective_by_its_busiest_instance_and_its_basis():
    device = mig_gpu(0, instance(1, processes=[process(1)], sm_active=70.0), instance(2, sm_active=0.0))
    found = state(device)
    assert (found.basis, found.active, found.effective) == ("dcgm", True, True)


def test_a_mig_gpu_whose_instances_are_all_idle_is_not_active_though_a_process_runs():
    device = mig_gpu(0, instance(1, processes=[process(1)], sm_active=0.0, graphics_active=0.0))
    found = state(device)
    assert (found.allocated, found.active, found.effective) == (True, False, False)


def test_a_mig_instance_with_a_process_but_no_activity_is_an_idle_workload():
    device = mig_gpu(0, instance(1, processes=[process(1)], sm_active=0.0),
                     instance(2, processes=[process(2)], sm_active=45.0))
    idle = {w.target[1]: w.idle for w in attributed(device).workloads}
    assert idle == {"MIG-1": True, "MIG-2": False}


def test_a_mig_instance_with_graphics_activity_only_is_judged_by_it():
    device = mig_gpu(0, instance(1, processes=[process(1)], graphics_active=0.0),
                     instance(2, processes=[process(2)], graphics_active=12.0))
    idle = {w.target[1]: w.idle for w in attributed(device).workloads}
    assert idle == {"MIG-1": True, "MIG-2": False}


def test_a_mig_instance_nobody_profiles_is_judged_by_its_processes():
    device = mig_gpu(0, instance(1, source=None, processes=[process(1)]), instance(2, source=None))
    assert state(device).basis == "utilization"
    assert {w.target[1]: w.idle for w in attributed(device).workloads} == {"MIG-1": False}


def test_the_workloads_of_a_shared_gpu_are_idle_when_its_activity_is_nil():
    shared = [process(1, sm=3.0), process(2, sm=0.0)]
    quiet = {w.holder.container_id: w.idle for w in attributed(
        gpu(0, source="dcgm", processes=shared, graphics_active=0.0, **{"utilization.gpu": 0.0})).workloads}
    assert quiet == {"c0ffee1": True, "c0ffee2": True}
    working = {w.holder.container_id: w.idle for w in attributed(
        gpu(0, source="dcgm", processes=shared, graphics_active=30.0, **{"utilization.gpu": 30.0})).workloads}
    assert working == {"c0ffee1": False, "c0ffee2": True}


def test_the_funnel_counts_each_model_by_basis():
    devices = [
        gpu(0, name=A100, source="dcgm", processes=[process(1)], sm_active=80.0),
        gpu(1, name=A100, source="dcgm", processes=[process(2)], sm_active=10.0),
        gpu(2, name=A100, processes=[process(3)], **{"utilization.gpu": 90.0}),
        gpu(3, name="NVIDIA H100 80GB HBM3", source="gpm", processes=[process(4)], sm_active=55.0),
        gpu(4, name="NVIDIA L4", source="dcgm", graphics_active=0.0),
    ]
    assert attributed(*devices).funnel == {
        (A100, "dcgm"): {"total": 2, "allocated": 2, "active": 2, "effective": 1},
        (A100, "utilization"): {"total": 1, "allocated": 1, "active": 1, "effective": 1},
        ("NVIDIA H100 80GB HBM3", "gpm"): {"total": 1, "allocated": 1, "active": 1, "effective": 1},
        ("NVIDIA L4", "dcgm"): {"total": 1, "allocated": 0, "active": 0, "effective": 0},
    }


def test_each_fleet_series_says_its_basis(aggregator):
    devices = [
        gpu(0, name=A100, source="dcgm", processes=[process(1)], sm_active=80.0),
        gpu(1, name=A100, processes=[process(2)], **{"utilization.gpu": 90.0}),
    ]
    snapshot = Snapshot(timestamp=0.0, node=Node(), devices=devices)
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{"kubernetes": False}])
    Submitter(check, ["team:ml"], lambda _entity: []).submit(
        snapshot, {d.index: Health() for d in devices}, attribute(snapshot, None, 50.0, no_price), NO_NODE)
    effective = aggregator.metrics("gpu_monitoring.fleet.devices.effective")
    by_basis = {tag_dict(m.tags)["activity_source"]: m for m in effective}
    assert set(by_basis) == {"dcgm", "utilization"}
    for basis, metric in by_basis.items():
        assert metric.value == 1
        assert sorted(metric.tags) == sorted(["team:ml", "gpu_device:nvidia_a100-sxm4-80gb",
                                      f"activity_source:{basis}"])


def test_a_node_without_gpm_or_dcgm_says_utilization(node):
    l4 = node("l4-mixed").run(2)
    for stage in ("total", "allocated", "active", "effective"):
        (series,) = l4.series(f"fleet.devices.{stage}")
        assert tag_dict(series.tags)["activity_source"] == "utilization"
