"""One pod the kubelet describes with a field of the wrong type (scenario dgx-h100): that pod alone
loses what the kubelet says of it; the other pods are attributed as always."""

import logging

from datadog_checks.base import AgentCheck

from .attribution_support import container_id, kubelet_check, kubelet_pods, pod_tags, processes, workloads

HELD = {(0, "llm-pretrain-0"): 1, (1, "llm-pretrain-0"): 1, (2, "vllm-llama-70b-5d8f7c9b6-x2kqp"): 1,
        (3, "triton-resnet-6c9f8d7b5-q8wzt"): 1, (4, "jupyter-alice"): 1, (5, "jupyter-bob"): 1,
        (6, "finetune-mistral-7b-0"): 1}


def test_one_bad_pod_costs_that_pod_alone(node, caplog):
    caplog.set_level(logging.INFO)
    dgx = node("dgx-h100", pod_cache_ttl=0)
    pods = kubelet_pods(dgx)
    for pod in pods:
        if pod["name"] == "jupyter-alice":
            pod["labels"] = {"team": 5}
    dgx.check.simulated_node.kubelet.set_pods(pods)
    dgx.run(3)
    assert kubelet_check().status == AgentCheck.OK
    # The allocation is still named from pod-resources; every pod is where it was.
    assert workloads(dgx, "workload.gpus") == HELD
    by_pid = processes(dgx, "process.memory.used")
    # The other pods' processes are attributed through the kubelet's container IDs ...
    assert pod_tags(by_pid[52310].tags)["pod_name"] == "vllm-llama-70b-5d8f7c9b6-x2kqp"
    assert pod_tags(by_pid[41021].tags)["pod_name"] == "llm-pretrain-0"
    # ... the bad pod's by its cgroup alone.
    assert pod_tags(by_pid[71002].tags) == {"container_id": container_id(dgx, "jupyter-alice")}
    told = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(told) == 1 and "jupyter-alice is skipped: metadata.labels['team'] is an integer" in told[0], told
