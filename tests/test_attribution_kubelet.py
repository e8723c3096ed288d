"""The kubelet's `/pods` as the check uses it (scenario dgx-h100): terminal pods, and a kubelet that
is down, refuses the token or sends garbage — metrics keep flowing, the service check says why,
the log says it once, and the kubelet is asked once per `pod_cache_ttl`."""

import logging

import pytest
import yaml
from datadog_checks.base import AgentCheck

from gpu_monitoring.kube.pod_list import TERMINAL_PHASES
from gpu_monitoring.kube.pod_resources import ALLOCATABLE_METHOD
from gpu_monitoring.simulator.scenario import SCENARIO_DIR

from .attribution_support import container_id, funnel, kubelet_check, kubelet_pods, pod_tags, processes, workloads
from .conftest import tag_dict

PODS = yaml.safe_load((SCENARIO_DIR / "dgx-h100.yaml").read_text())["kubernetes"]["pods"]


def pids_of(pods):
    """{pid: pod name} of the GPU processes the pods' containers run."""
    return {pid: pod["name"] for pod in pods for container in pod["containers"]
            for pid in container.get("processes", [])}


PIDS = pids_of(pod for pod in PODS if pod.get("phase") not in TERMINAL_PHASES)
# The process a pod that failed left on GPU 7, which nobody was given.
LEFT_BEHIND = pids_of(pod for pod in PODS if pod.get("phase") in TERMINAL_PHASES)
FREE_GPU = 7
BUSY = [0, 1, 2, 3, 4, 6]
LONG_TTL = 3600
RUNS = 3


def warnings_logged(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- terminal pods -----------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_holds_nothing_though_pod_resources_lists_it(node, phase):
    dgx = node("dgx-h100", pod_cache_ttl=0, hourly_price={"NVIDIA H100*": 4.0}).run()
    assert funnel(dgx)["allocated"] == 7
    dgx.check.simulated_node.kubelet.set_pods(kubelet_pods(dgx, {"jupyter-bob": phase}))
    dgx.run()
    # pod-resources still lists jupyter-bob's GPU 5 ...
    assert "jupyter-bob" in {a.pod for a in dgx.check.simulated_node.allocations()}
    # ... but the kubelet says the pod is over: GPU 5 is free again.
    assert funnel(dgx) == {"total": 8, "allocated": 6, "active": 6, "effective": funnel(dgx)["effective"]}
    assert "jupyter-bob" not in {pod for _, pod in workloads(dgx, "workload.gpus")}
    assert len(workloads(dgx, "workload.gpus")) == 6
    (gpu5,) = [s for s in dgx.series("utilization.gpu") if tag_dict(s.tags)["gpu_index"] == "5"]
    assert pod_tags(gpu5.tags) == {}
    assert dgx.values("cost.idle_hourly")[5] == 4.0
    assert kubelet_check().status == AgentCheck.OK


def test_a_pending_pod_still_holds_its_gpu(node):
    dgx = node("dgx-h100", pod_cache_ttl=0).run()
    dgx.check.simulated_node.kubelet.set_pods(kubelet_pods(dgx, {"jupyter-bob": "Pending"}))
    dgx.run()
    assert funnel(dgx)["allocated"] == 7
    assert workloads(dgx, "workload.gpus")[(5, "jupyter-bob")] == 1


# --- a kubelet that does not answer as it should --------------------------------------------


def degrade(kubelet, how):
    if how == "stopped":
        kubelet.stop()
    else:
        kubelet.behaviour = how


DEGRADED = [
    # how, status, what the message says
    ("error", AgentCheck.WARNING, "failed with HTTP 500"),
    ("stopped", AgentCheck.WARNING, "cannot connect to the kubelet"),
    ("unauthorized", AgentCheck.CRITICAL, "(HTTP 401)"),
    ("garbage", AgentCheck.CRITICAL, "did not send a valid pod list"),
    ("slow", AgentCheck.WARNING, "did not answer"),
]


@pytest.mark.parametrize("how, status, reason", DEGRADED)
def test_metrics_keep_flowing_without_the_kubelet(node, caplog, how, status, reason):
    caplog.set_level(logging.INFO)
    dgx = node("dgx-h100", pod_cache_ttl=LONG_TTL, kubelet_timeout=0.3)
    degrade(dgx.check.simulated_node.kubelet, how)
    for _ in range(RUNS):
        dgx.run()
        check = kubelet_check()
        assert check.status == status
        assert reason in check.message and "named from pod-resources alone" in check.message, check.message
    # Every GPU still reports.
    assert set(dgx.values("utilization.gpu")) == set(range(8))
    assert funnel(dgx)["total"] == 8
    # A process keeps the owner its own cgroup names, the container ID (the Agent's tagger adds the
    # pod's tags to it), never the names of whoever holds its GPU; the GPU's own series carry the
    # holder pod-resources names, and that pod's workload is the one using it.
    by_pid = processes(dgx, "process.memory.used")
    assert set(by_pid) == set(PIDS) | set(LEFT_BEHIND)
    for pid, pod in {**PIDS, **LEFT_BEHIND}.items():
        tags = pod_tags(by_pid[pid].tags)
        assert tags == {"container_id": container_id(dgx, pod)}, by_pid[pid].tags
        assert "process_name" in tag_dict(by_pid[pid].tags)
    held = {pod_tags(s.tags).get("pod_name") for s in dgx.series("utilization.gpu")}
    assert set(PIDS.values()) <= held
    busy = {pod for (_, pod), idle in workloads(dgx, "workload.idle").items() if not idle}
    assert set(PIDS.values()) <= busy
    # GPU 7 was given to nobody, and without the kubelet nobody can tell the pod whose process runs on
    # it failed: that is a container's process on a GPU nobody gave it, a workload holding none of it,
    # not a zombie the GPU is warned of. As the one container on the GPU it names the GPU's series,
    # by its container ID alone.
    (pid,) = LEFT_BEHIND
    leftover = {"container_id": container_id(dgx, LEFT_BEHIND[pid])}
    (free,) = [s for s in dgx.series("utilization.gpu") if tag_dict(s.tags)["gpu_index"] == str(FREE_GPU)]
    assert pod_tags(free.tags) == leftover
    on_free = [(pod_tags(s.tags), s.value) for s in dgx.series("workload.gpus")
               if tag_dict(s.tags)["gpu_index"] == str(FREE_GPU)]
    assert on_free == [(leftover, 0)]
    assert dgx.health()[FREE_GPU].status == AgentCheck.OK
    # One log line for the whole outage, not one per run.
    logged = warnings_logged(caplog)
    assert len(logged) == 1, logged
    assert reason in logged[0]


@pytest.mark.parametrize("how, status, reason", DEGRADED)
def test_a_failing_kubelet_is_asked_once_per_ttl(node, how, status, reason):
    dgx = node("dgx-h100", pod_cache_ttl=LONG_TTL, kubelet_timeout=0.3)
    server = dgx.check.simulated_node.kubelet
    degrade(server, how)
    dgx.run(RUNS)
    assert dgx.check.pods.kubelet.requests == 1
    assert server.requests == (0 if how == "stopped" else 1)


def test_a_healthy_kubelet_is_asked_once_per_ttl(node):
    dgx = node("dgx-h100", pod_cache_ttl=LONG_TTL).run(RUNS)
    assert dgx.check.simulated_node.kubelet.requests == 1
    assert kubelet_check().status == AgentCheck.OK


def test_busy_pods_are_not_reported_idle_while_the_kubelet_is_down(node):
    dgx = node("dgx-h100", pod_cache_ttl=LONG_TTL, hourly_price={"NVIDIA H100*": 4.0})
    dgx.check.simulated_node.kubelet.behaviour = "error"
    dgx.run(2)
    idle = {}
    for stub in dgx.series("workload.idle"):
        index = int(tag_dict(stub.tags)["gpu_index"])
        idle.setdefault(index, []).append(stub.value)
    # One workload per held GPU, busy on the GPUs whose processes run, as when the kubelet answers;
    # and on GPU 7, given to nobody, the process of a pod nobody can tell has failed: idle, holding none of it.
    assert idle == {**{index: [0] for index in BUSY}, 5: [1], FREE_GPU: [1]}
    assert dgx.values("workload.gpus")[FREE_GPU] == 0
    total_idle_cost = sum(s.value for s in dgx.series("workload.cost.idle_hourly"))
    assert total_idle_cost == 4.0  # jupyter-bob's GPU 5 only


def test_the_kubelet_recovers(node, caplog):
    caplog.set_level(logging.INFO)
    dgx = node("dgx-h100", pod_cache_ttl=0)
    kubelet = dgx.check.simulated_node.kubelet
    kubelet.behaviour = "error"
    dgx.run(2)
    assert kubelet_check().status == AgentCheck.WARNING
    kubelet.behaviour = "ok"
    dgx.run()
    check = kubelet_check()
    assert check.status == AgentCheck.OK and not check.message
    assert workloads(dgx, "workload.gpus") == {
        (0, "llm-pretrain-0"): 1, (1, "llm-pretrain-0"): 1, (2, "vllm-llama-70b-5d8f7c9b6-x2kqp"): 1,
        (3, "triton-resnet-6c9f8d7b5-q8wzt"): 1, (4, "jupyter-alice"): 1, (5, "jupyter-bob"): 1,
        (6, "finetune-mistral-7b-0"): 1,
    }
    assert pod_tags(processes(dgx, "process.memory.used")[52310].tags)["pod_name"] == PIDS[52310]
    assert len(warnings_logged(caplog)) == 1
    assert any("answer again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_a_rotated_token_is_read_again_after_one_401(node, caplog):
    caplog.set_level(logging.WARNING)
    dgx = node("dgx-h100", pod_cache_ttl=0).run()
    server = dgx.check.simulated_node.kubelet
    assert server.requests == 1
    # The service account token rotates: the kubelet takes only the new one, which is on disk.
    server.set_token("rotated-token")
    server.write_token_file()
    dgx.run()
    check = kubelet_check()
    assert check.status == AgentCheck.OK and not check.message
    # The refused request, then the retry with the token read again.
    assert server.requests == 3
    assert workloads(dgx, "workload.gpus")[(2, "vllm-llama-70b-5d8f7c9b6-x2kqp")] == 1
    dgx.run()
    assert server.requests == 4
    assert kubelet_check().status == AgentCheck.OK
    assert warnings_logged(caplog) == []


def test_a_token_the_kubelet_no_longer_takes_is_critical(node):
    dgx = node("dgx-h100", pod_cache_ttl=0).run()
    server = dgx.check.simulated_node.kubelet
    # Rotated on the kubelet's side but not (yet) on disk: reading the file again does not help.
    server.set_token("rotated-token")
    dgx.run()
    check = kubelet_check()
    assert check.status == AgentCheck.CRITICAL
    assert "HTTP 401" in check.message and server.token_path in check.message
    # The file catches up: the next request succeeds.
    server.write_token_file()
    dgx.run()
    assert kubelet_check().status == AgentCheck.OK


# --- the device plugin's view ------------------------------------------------------------

NOT_OFFERED = "Kubernetes does not offer this GPU (the device plugin marked it unhealthy, or is down)"


def allocatable(node):
    (stub,) = node.series("fleet.devices.allocatable")
    assert tag_dict(stub.tags)["gpu_device"] == "nvidia_h100_80gb_hbm3"
    return stub.value


def not_offered(node):
    return {index for index, stub in node.health().items() if NOT_OFFERED in (stub.message or "")}


def test_every_gpu_the_plugin_advertises_is_allocatable(node):
    dgx = node("dgx-h100").run()
    assert allocatable(dgx) == 8
    assert not_offered(dgx) == set()


def test_a_gpu_the_plugin_stops_advertising_warns(node):
    dgx = node("dgx-h100")
    served = dgx.check.simulated_node
    free_uuid = served.device_id(f"gpu:{FREE_GPU}")
    served.pod_resources.set_advertised([a for a in served.advertised() if a.device_id != free_uuid])
    dgx.run()
    assert allocatable(dgx) == 7
    assert not_offered(dgx) == {FREE_GPU}
    assert dgx.health()[FREE_GPU].status == AgentCheck.WARNING
    # Its metrics keep flowing: only Kubernetes cannot schedule it.
    assert FREE_GPU in dgx.values("utilization.gpu")


def test_a_device_plugin_that_is_down_offers_nothing(node):
    dgx = node("dgx-h100")
    dgx.check.simulated_node.pod_resources.set_advertised([])
    dgx.run()
    assert allocatable(dgx) == 0
    assert not_offered(dgx) == set(range(8))


def test_without_allocatable_nothing_is_claimed_about_it(node):
    dgx = node("dgx-h100")
    dgx.check.simulated_node.pod_resources.set_behaviour("unimplemented", ALLOCATABLE_METHOD)
    dgx.run()
    assert dgx.series("fleet.devices.allocatable") == []
    assert not_offered(dgx) == set()
    assert funnel(dgx)["allocated"] == 7
