"""Shared GPUs (scenario t4-shared): GPU 0 advertised as 8 time-slicing replicas of which pods hold
four (::0, ::1, ::2, ::5), GPU 1 shared through MPS in 4 replicas, all held.

Each container holds one advertised replica: 1/8 of GPU 0, 1/4 of GPU 1. Without
GetAllocatableResources (kubelet before 1.23) the count falls back to the highest held ID + 1 (6),
and the kubelet service check says so. The shared GPUs' own series carry no pod (no double
counting) while the workload series do; the MPS server serves its clients and is no workload.
"""

import pytest
from datadog_checks.base import AgentCheck

from gpu_monitoring.kube.pod_resources import ALLOCATABLE_METHOD

from .attribution_support import MIB, container_id, funnel, kubelet_check, pod_tags, processes, workloads
from .conftest import tag_dict

T4_PRICE = 0.35
TIME_SLICED, MPS = 0, 1
# pod: (gpu, container, pids)
PODS = {
    "analytics-a": (TIME_SLICED, "deepstream", [2201]),
    "analytics-b": (TIME_SLICED, "deepstream", [2202]),
    "analytics-c": (TIME_SLICED, "tracker", [2203]),
    "analytics-d": (TIME_SLICED, "tracker", []),
    "infer-1": (MPS, "model", [3311]),
    "infer-2": (MPS, "model", [3312]),
    "infer-3": (MPS, "model", [3313]),
    "infer-4": (MPS, "model", []),
}
IDLE_PODS = {"analytics-d", "infer-4"}
# What the device plugin advertises per GPU, and what the highest held replica ID implies without it.
ADVERTISED = {TIME_SLICED: 8, MPS: 4}
INFERRED = {TIME_SLICED: 6, MPS: 4}
MEMORY_MIB = {2201: 3100, 2202: 2900, 2203: 1800, 3311: 2100, 3312: 1900, 3313: 1200}
MPS_SERVER, MPS_DAEMON_POD = 3300, "nvidia-device-plugin-mps-control-daemon-7xk2p"


@pytest.fixture
def t4(node):
    # NVML alone (no DCGM activity): the funnel as processes and utilization tell it.
    return node("t4-shared", hourly_price={"Tesla T4": T4_PRICE}, dcgm_exporter_url="none").run(2)


def test_sharing_modes(t4, aggregator):
    for name in aggregator.metric_names:
        for stub in aggregator.metrics(name):
            tags = tag_dict(stub.tags)
            if "gpu_index" in tags:
                assert tags["gpu_sharing_mode"] == {"0": "time_slicing", "1": "mps"}[tags["gpu_index"]], stub
                # Sharing is no slicing for the Agent's gpu check either: a filter on it matches both.
                assert tags["gpu_slicing_mode"] == "none", stub
    modes = {int(tag_dict(s.tags)["gpu_index"]): tag_dict(s.tags)["gpu_sharing_mode"] for s in t4.health().values()}
    assert modes == {TIME_SLICED: "time_slicing", MPS: "mps"}


def test_every_container_holds_one_advertised_replica(t4):
    gpus = workloads(t4, "workload.gpus")
    assert gpus == {(gpu, pod): 1 / ADVERTISED[gpu] for pod, (gpu, _, _) in PODS.items()}
    # GPU 1's four replicas are all held; half of GPU 0's are free, and free replicas are no pod's.
    assert sum(v for (index, _), v in gpus.items() if index == MPS) == 1
    assert sum(v for (index, _), v in gpus.items() if index == TIME_SLICED) == 0.5
    check = kubelet_check()
    assert check.status == AgentCheck.OK and not check.message


def test_an_old_kubelet_falls_back_to_the_held_replicas_and_says_so_once(node, caplog):
    t4 = node("t4-shared")
    t4.check.simulated_node.pod_resources.set_behaviour("unimplemented", ALLOCATABLE_METHOD)
    for _ in range(3):
        t4.run()
        check = kubelet_check()
        # WARNING like pod-resources' other failures: the Agent drops an OK check's message.
        assert check.status == AgentCheck.WARNING
        assert check.message.count("replicas pods hold") == 1, check.message
        assert "GetAllocatableResources" in check.message and "Kubernetes 1.23" in check.message
    assert workloads(t4, "workload.gpus") == {(gpu, pod): 1 / INFERRED[gpu] for pod, (gpu, _, _) in PODS.items()}
    # Asked once per TTL, not once per run; logged when it changes, not every run.
    assert t4.check.simulated_node.pod_resources.allocatable_requests == 1
    degraded = [r for r in caplog.records if "GetAllocatableResources" in r.getMessage()]
    assert len(degraded) == 1


def test_idle_replicas(t4):
    idle = workloads(t4, "workload.idle")
    assert idle == {(gpu, pod): int(pod in IDLE_PODS) for pod, (gpu, _, _) in PODS.items()}
    memory = workloads(t4, "workload.memory.used")
    assert memory == {(gpu, pod): sum(MEMORY_MIB[p] for p in pids) * MIB for pod, (gpu, _, pids) in PODS.items()}
    sm = workloads(t4, "workload.sm_utilization")
    process_sm = {pid: stub.value for pid, stub in processes(t4, "process.sm_utilization").items()}
    for pod, (gpu, _, pids) in PODS.items():
        if gpu == MPS and pids:
            continue  # below
        assert sm[(gpu, pod)] == sum(process_sm[pid] for pid in pids)
        assert (sm[(gpu, pod)] > 0) == (pod not in IDLE_PODS)


def test_mps_clients_kernels_are_sampled_as_the_servers(t4, aggregator):
    # As on a real H100 under MPS: NVML samples the MPS server for the work of all its clients, and
    # no client, so a client's SM use is unknown (no series), not 0; the server's is their sum.
    process_sm = {pid: stub.value for pid, stub in processes(t4, "process.sm_utilization").items()}
    clients = [pid for _, (gpu, _, pids) in PODS.items() if gpu == MPS for pid in pids]
    assert not set(clients) & set(process_sm)
    assert process_sm[MPS_SERVER] > 0
    assert {pod for (gpu, pod) in workloads(t4, "workload.sm_utilization") if gpu == MPS} == {"infer-4"}
    # Their memory is theirs, each client listed once though the driver lists it twice.
    memory = [stub for stub in t4.series("process.memory.used") if tag_dict(stub.tags)["pid"] in map(str, clients)]
    assert sorted(int(tag_dict(stub.tags)["pid"]) for stub in memory) == sorted(clients)


def test_mps_limits(t4):
    # Only the MPS clients have CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: 25.
    assert workloads(t4, "workload.sm_limit") == {(MPS, pod): 25 for pod, (gpu, _, _) in PODS.items() if gpu == MPS}


def test_the_mps_server_is_no_workload(t4):
    pods = {pod for _, pod in workloads(t4, "workload.gpus")}
    assert MPS_DAEMON_POD not in pods
    assert pods == set(PODS)
    # It is one of GPU 1's four processes, and its process series names its pod.
    assert t4.values("processes.count") == {TIME_SLICED: 3, MPS: 4}
    server = processes(t4, "process.memory.used")[MPS_SERVER]
    assert server.value == 30 * MIB
    assert tag_dict(server.tags)["process_name"] == "nvidia-cuda-mps-server"
    assert pod_tags(server.tags)["pod_name"] == MPS_DAEMON_POD


def test_shared_gpus_carry_no_pod_tags(t4, aggregator):
    for name in aggregator.metric_names:
        if name.startswith(("gpu_monitoring.workload.", "gpu_monitoring.process.")):
            continue
        for stub in aggregator.metrics(name):
            assert pod_tags(stub.tags) == {}, (name, stub.tags)
    for stub in aggregator.service_checks("gpu_monitoring.device.health"):
        assert pod_tags(stub.tags) == {}


def test_workload_and_process_series_carry_their_pod(t4):
    for stub in t4.series("workload.gpus"):
        tags = pod_tags(stub.tags)
        gpu, container, _ = PODS[tags["pod_name"]]
        assert tag_dict(stub.tags)["gpu_index"] == str(gpu)
        assert tags == {
            "pod_name": tags["pod_name"],
            "kube_namespace": "video" if gpu == TIME_SLICED else "edge",
            "kube_container_name": container,
            "container_id": container_id(t4, tags["pod_name"]),
        }
    by_pid = processes(t4, "process.memory.used")
    for pod, (gpu, _, pids) in PODS.items():
        for pid in pids:
            assert tag_dict(by_pid[pid].tags)["gpu_index"] == str(gpu)
            assert pod_tags(by_pid[pid].tags)["pod_name"] == pod
            assert by_pid[pid].value == MEMORY_MIB[pid] * MIB


def test_costs(t4):
    assert t4.values("cost.hourly") == {TIME_SLICED: T4_PRICE, MPS: T4_PRICE}
    share = {gpu: T4_PRICE / replicas for gpu, replicas in ADVERTISED.items()}
    assert workloads(t4, "workload.cost.hourly") == pytest.approx(
        {(gpu, pod): share[gpu] for pod, (gpu, _, _) in PODS.items()})
    idle_workloads = workloads(t4, "workload.cost.idle_hourly")
    assert idle_workloads == pytest.approx(
        {(gpu, pod): share[gpu] if pod in IDLE_PODS else 0.0 for pod, (gpu, _, _) in PODS.items()})
    # Both GPUs do work, yet part of each is paid for idle: its idle pods' replicas, and the replicas
    # nobody holds (half of GPU 0's).
    held = {gpu: sum(1 for held_on, _, _ in PODS.values() if held_on == gpu) for gpu in ADVERTISED}
    unheld = {gpu: (ADVERTISED[gpu] - held[gpu]) * share[gpu] for gpu in ADVERTISED}
    assert unheld[TIME_SLICED] == pytest.approx(T4_PRICE / 2) and unheld[MPS] == 0
    assert t4.values("cost.idle_hourly") == pytest.approx(
        {gpu: sum(cost for (on, _), cost in idle_workloads.items() if on == gpu) + unheld[gpu] for gpu in ADVERTISED})


def test_funnel(t4):
    utilization = t4.values("utilization.gpu")
    # T4 has no GPM: effective follows utilization.gpu against the threshold of 50 %.
    effective = sum(1 for gpu in (TIME_SLICED, MPS) if utilization[gpu] >= 50)
    assert funnel(t4) == {"total": 2, "allocated": 2, "active": 2, "effective": effective}
    # Both GPUs are advertised (GPU 0 as 8 replicas, GPU 1 as 4): each counts once.
    (allocatable,) = t4.series("fleet.devices.allocatable")
    assert allocatable.value == 2
