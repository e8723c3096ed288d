"""Helpers the attribution tests share: reading workload series, pods and the kubelet service check."""

from datadog_checks.base.stubs import aggregator as _aggregator

from .conftest import tag_dict

KUBELET_CHECK = "gpu_monitoring.kubelet.can_connect"
POD_TAGS = ("pod_name", "kube_namespace", "kube_container_name", "container_id")
MIB = 1024 * 1024


def pod_tags(tags):
    """The pod/container tags among `tags`, as a dict."""
    return {key: value for key, value in tag_dict(tags).items() if key in POD_TAGS}


def workloads(node, metric):
    """{(gpu index, pod name): value} of a workload metric on whole GPUs (MIG instances left out)."""
    return node.keyed(
        metric, lambda t: None if "gpu_instance_id" in t else (int(t["gpu_index"]), t.get("pod_name"))
    )


def instance_workloads(node, metric):
    """{(gpu index, gpu instance id, pod name): value} of a workload metric on MIG instances."""
    return node.keyed(
        metric,
        lambda t: (int(t["gpu_index"]), int(t["gpu_instance_id"]), t.get("pod_name")) if "gpu_instance_id" in t
        else None,
    )


def processes(node, metric):
    """{pid: stub} of a per-process metric."""
    out = {}
    for stub in node.series(metric):
        pid = int(tag_dict(stub.tags)["pid"])
        assert pid not in out, f"{metric} submitted twice for pid {pid}"
        out[pid] = stub
    return out


def funnel(node):
    """{stage: value} of the fleet funnel (one GPU model on the node)."""
    out = {}
    for stage in ("total", "allocated", "active", "effective"):
        (stub,) = node.series(f"fleet.devices.{stage}")
        out[stage] = stub.value
    return out


def kubelet_check():
    """The one kubelet.can_connect service check of the last run."""
    (stub,) = _aggregator.service_checks(KUBELET_CHECK)
    return stub


def container_id(node, pod, container=None):
    """The container ID the simulated node gave a pod's (first or named) container."""
    for found in node.check.simulated_node.pods:
        if found["name"] == pod:
            return next(c for c in found["containers"] if container in (None, c["name"]))["container_id"]
    raise KeyError(pod)


def kubelet_pods(node, phases=None):
    """The simulated node's pods as the kubelet server serves them, with some pods' phase replaced."""
    phases = phases or {}
    return [
        {
            "uid": pod["uid"],
            "name": pod["name"],
            "namespace": pod["namespace"],
            "phase": phases.get(pod["name"], pod["phase"]),
            "containers": [
                {"name": c["name"], "container_id": c["container_id"], "runtime": c.get("runtime", "containerd"),
                 "env": c.get("env", {})}
                for c in pod["containers"]
            ],
        }
        for pod in node.check.simulated_node.pods
    ]
