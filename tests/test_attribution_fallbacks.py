"""Attribution with less to go on (scenario dgx-h100): no pod-resources socket, and no Kubernetes at all.

Without pod-resources a GPU counts as allocated while it runs a compute process, and the kubelet
service check says so; off Kubernetes there is no kubelet check, no pod, the processes keep their
names, and the host's own processes are its workloads.
"""

import logging

import pytest
import yaml
from datadog_checks.base import AgentCheck

from gpu_monitoring.simulator.proc_root import build_proc_root
from gpu_monitoring.simulator.scenario import SCENARIO_DIR

from .attribution_support import KUBELET_CHECK, container_id, funnel, kubelet_check, pod_tags, processes, workloads
from .conftest import tag_dict

# The GPUs whose processes run (the pod each runs in); GPU 7's one process is the leftover of a pod
# that failed, which runs nothing.
RUNNING = {0: "llm-pretrain-0", 1: "llm-pretrain-0", 2: "vllm-llama-70b-5d8f7c9b6-x2kqp",
           3: "triton-resnet-6c9f8d7b5-q8wzt", 4: "jupyter-alice", 6: "finetune-mistral-7b-0"}
DEVICES = yaml.safe_load((SCENARIO_DIR / "dgx-h100.yaml").read_text())["devices"]
NAMES = {process["pid"]: process["name"] for device in DEVICES for process in device.get("processes", [])}
WITH_PROCESSES = {index for index, device in enumerate(DEVICES) if device.get("processes")}


def stop_pod_resources(dgx):
    dgx.check.simulated_node.pod_resources.stop()


def missing_socket_option(tmp_path):
    return {"pod_resources_socket": str(tmp_path / "nowhere" / "kubelet.sock"), "kubernetes": True}


@pytest.mark.parametrize("how", ["server stopped", "socket path missing"])
def test_without_pod_resources_running_a_process_is_allocated(node, tmp_path, caplog, how):
    caplog.set_level(logging.WARNING)
    options = missing_socket_option(tmp_path) if how == "socket path missing" else {}
    dgx = node("dgx-h100", hourly_price={"NVIDIA H100*": 4.0}, **options)
    if how == "server stopped":
        stop_pod_resources(dgx)
    dgx.run(3)
    sm_active = dgx.values("sm_active")
    effective = sum(1 for index in RUNNING if sm_active[index] >= 50)
    # jupyter-bob's GPU 5 runs nothing: without pod-resources nobody is seen to hold it. GPU 7 runs
    # only the process of a pod the kubelet says failed: a finished pod holds nothing.
    assert funnel(dgx) == {"total": 8, "allocated": 6, "active": 6, "effective": effective}
    check = kubelet_check()
    assert check.status == AgentCheck.WARNING
    assert "pod-resources" in check.message and "does not exist" in check.message
    assert "GPUs running a compute process count as allocated" in check.message
    # The kubelet still names the containers the processes run in.
    assert workloads(dgx, "workload.gpus") == {(index, pod): 1 for index, pod in RUNNING.items()}
    for index, pod in RUNNING.items():
        (stub,) = [s for s in dgx.series("utilization.gpu") if tag_dict(s.tags)["gpu_index"] == str(index)]
        assert pod_tags(stub.tags)["pod_name"] == pod
        assert pod_tags(stub.tags)["container_id"] == container_id(dgx, pod)
    assert dgx.values("cost.idle_hourly") == {i: 0.0 if i in RUNNING else 4.0 for i in range(8)}
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(logged) == 1 and "pod-resources" in logged[0], logged


def test_pod_resources_coming_back_restores_allocations(node):
    dgx = node("dgx-h100")
    stop_pod_resources(dgx)
    dgx.run()
    assert funnel(dgx)["allocated"] == 6
    dgx.check.simulated_node.pod_resources.start()
    dgx.run()
    assert funnel(dgx)["allocated"] == 7
    assert workloads(dgx, "workload.idle")[(5, "jupyter-bob")] == 1
    check = kubelet_check()
    assert check.status == AgentCheck.OK and not check.message


@pytest.fixture
def host_proc_root(tmp_path):
    """A proc root where the scenario's GPU processes are the host's own, in no container."""
    return build_proc_root(tmp_path / "proc", [{"pid": pid, "name": name} for pid, name in NAMES.items()])


def test_off_kubernetes(node, host_proc_root, aggregator):
    dgx = node("dgx-h100", kubernetes=False, proc_root=str(host_proc_root), hourly_price={"NVIDIA H100*": 4.0})
    dgx.run(2)
    # The simulated node still has its proc root, but serves no kubelet API.
    assert dgx.check.pods is None and dgx.check.simulated_node.kubelet is None
    assert aggregator.service_checks(KUBELET_CHECK) == []
    sm_active = dgx.values("sm_active")
    effective = sum(1 for index in RUNNING if sm_active[index] >= 50)
    # Allocated: running at least one compute process (GPU 7's too, which does nothing).
    assert funnel(dgx) == {"total": 8, "allocated": len(WITH_PROCESSES), "active": 6, "effective": effective}
    for name in aggregator.metric_names:
        for stub in aggregator.metrics(name):
            assert pod_tags(stub.tags) == {}, (name, stub.tags)
    by_pid = processes(dgx, "process.memory.used")
    assert {pid: tag_dict(stub.tags)["process_name"] for pid, stub in by_pid.items()} == NAMES
    # No container runs anything: the host's own processes are the workloads, one on each GPU they run
    # on, with no container's tags; the one on GPU 7 holds it idle.
    assert dgx.values("workload.gpus") == dict.fromkeys(WITH_PROCESSES, 1.0)
    assert dgx.values("workload.idle") == {i: float(i not in RUNNING) for i in WITH_PROCESSES}
    assert dgx.values("workload.cost.idle_hourly") == {i: 0.0 if i in RUNNING else 4.0 for i in WITH_PROCESSES}
    # Idle: GPU 7 as its workload's idle share, GPU 5 as capacity nobody holds.
    assert dgx.values("cost.idle_hourly") == {i: 0.0 if i in RUNNING else 4.0 for i in range(8)}
    assert dgx.check.warnings == []
