"""A node at the kubelet's default limit of 110 pods, with the specs real workloads carry (three
containers of a few dozen env vars each, labels, annotations, owner references, probes, volume
mounts; status with conditions and container statuses), served by an HTTPS kubelet as the check
reads it: about 1.5 MB of `/pods`.

Each answer lists the pods in a new order: the kubelet builds `/pods` from a Go map (kubelet
pkg/kubelet/pod/pod_manager.go, `GetPods` -> `podsMapToPods`), whose order Go randomizes on
every walk, so two answers about the same pods are seldom the same bytes.
"""

import json
import random
import threading
from typing import Any, Dict, List, Optional, Tuple

from gpu_monitoring.simulator.kubelet_server import KubeletServer

PODS = 110
GPU_PODS = 8
CONTAINERS = ("app", "istio-proxy", "log-shipper")
ENV_VARS = 28
NODE = "gpu-node-17"
STARTED = "2025-03-02T08:14:53Z"


class FullNodeKubelet(KubeletServer):
    """The simulated kubelet (HTTPS, bearer token) answering `/pods` with the full node's pods,
    in a new order each time; `touch()` changes one pod's status, as a probe or a restart does."""

    def __init__(self, pods: int = PODS, seed: int = 0):
        super().__init__(pods=[])
        self._random = random.Random(seed)
        self._items = [_encode(full_pod(i)) for i in range(pods)]
        self._restarts = 0
        self._items_lock = threading.Lock()

    def touch(self) -> None:
        """One pod's container restarts: its status (restart count, start time) changes."""
        self._restarts += 1
        pod = full_pod(0)
        pod["status"]["containerStatuses"][0]["restartCount"] = self._restarts
        pod["metadata"]["resourceVersion"] = str(900000 + self._restarts)
        with self._items_lock:
            self._items[0] = _encode(pod)

    def body(self) -> bytes:
        with self._items_lock:
            items = list(self._items)
        self._random.shuffle(items)
        return b'{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[' + b",".join(items) + b"]}"

    def _answer(self, path: str, authorization: Optional[str]) -> Tuple[int, bytes]:
        status, body = super()._answer(path, authorization)
        return (status, self.body()) if status == 200 else (status, body)


def _encode(pod: Dict[str, Any]) -> bytes:
    # Go's encoding/json writes no spaces.
    return json.dumps(pod, separators=(",", ":")).encode()


def full_pod(i: int) -> Dict[str, Any]:
    """Pod `i` of the node: a few hold a GPU, one is dcgm-exporter, the rest are services."""
    gpus = i < GPU_PODS
    name, namespace, owner = _identity(i)
    uid = f"{i:08x}-5b1e-4c2a-9f3d-{i * 7919:012x}"
    return {
        "metadata": _metadata(name, namespace, uid, owner),
        "spec": {
            "volumes": _volumes(),
            "containers": [_container(c, i, gpus and c == "app") for c in CONTAINERS],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "nodeName": NODE,
            "securityContext": {"runAsNonRoot": True, "fsGroup": 2000},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": _status(i),
    }


def _identity(i: int) -> Tuple[str, str, str]:
    """Name, namespace and controller kind of pod `i`."""
    if i < GPU_PODS:
        return f"trainer-{i}", "ml", "Job"
    if i == GPU_PODS:
        return "nvidia-dcgm-exporter-x7k2p", "gpu-operator", "DaemonSet"
    return f"svc-{i % 23}-{i:04d}-7f9c8d5b6-x{i:03d}q", f"team-{i % 7}", "ReplicaSet"


def _metadata(name: str, namespace: str, uid: str, owner_kind: str) -> Dict[str, Any]:
    return {
        "name": name,
        "generateName": name.rsplit("-", 1)[0] + "-",
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": str(int(uid[:8], 16) + 812345),
        "creationTimestamp": STARTED,
        "labels": {
            "app": name.rsplit("-", 1)[0],
            "app.kubernetes.io/name": name.split("-")[0],
            "app.kubernetes.io/instance": name.rsplit("-", 2)[0],
            "app.kubernetes.io/version": "2.14.3",
            "app.kubernetes.io/part-of": namespace,
            "pod-template-hash": "7f9c8d5b6",
            "security.istio.io/tlsMode": "istio",
            "team": namespace,
        },
        "annotations": {
            "kubernetes.io/config.seen": STARTED,
            "kubernetes.io/config.source": "api",
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "9090",
            "checksum/config": "3f1e0c9a7b2d4e6f8a1c3e5d7b9f0a2c4e6d8b0a1c3e5f7d9b1a3c5e7f9d1b3a",
            "sidecar.istio.io/status": json.dumps({"initContainers": ["istio-init"], "containers": ["istio-proxy"],
                                                   "volumes": ["istio-envoy", "istio-data", "istio-token"]}),
        },
        "ownerReferences": [{"apiVersion": "batch/v1" if owner_kind == "Job" else "apps/v1",
                             "kind": owner_kind, "name": name.rsplit("-", 1)[0], "uid": uid[::-1],
                             "controller": True, "blockOwnerDeletion": True}],
    }


def _volumes() -> List[Dict[str, Any]]:
    return [
        {"name": "config", "configMap": {"name": "app-config", "defaultMode": 420}},
        {"name": "istio-envoy", "emptyDir": {"medium": "Memory"}},
        {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                          "fieldPath": "metadata.namespace"}}]}},
        ]}},
    ]


def _container(name: str, i: int, gpu: bool) -> Dict[str, Any]:
    limits = {"cpu": "2", "memory": "4Gi", **({"nvidia.com/gpu": "1"} if gpu else {})}
    return {
        "name": name,
        "image": f"registry.example.com/{name}:2.14.{i % 5}",
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
        "env": _env(name, i),
        "resources": {"limits": limits, "requests": {"cpu": "500m", "memory": "1Gi", **limits}},
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/app", "readOnly": True},
            {"name": "istio-envoy", "mountPath": "/etc/istio/proxy"},
            {"name": "kube-api-access", "readOnly": True,
             "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ],
        "livenessProbe": _probe("/healthz"),
        "readinessProbe": _probe("/ready"),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }


def _env(container: str, i: int) -> List[Dict[str, Any]]:
    env: List[Dict[str, Any]] = [
        {"name": f"{container.upper().replace('-', '_')}_SETTING_{k:02d}",
         "value": f"value-{k}-of-{container}-for-replica-{i}-{k * i}"}
        for k in range(ENV_VARS - 4)
    ]
    env += [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
            {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
            {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "50"}]
    return env


def _probe(path: str) -> Dict[str, Any]:
    return {"httpGet": {"path": path, "port": 8080, "scheme": "HTTP"}, "initialDelaySeconds": 10,
            "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}


def _status(i: int) -> Dict[str, Any]:
    ip = f"10.42.{i // 200}.{i % 200 + 2}"
    return {
        "phase": "Running",
        "conditions": [{"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": STARTED}
                       for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                    "PodScheduled")],
        "hostIP": "10.0.3.17",
        "hostIPs": [{"ip": "10.0.3.17"}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": STARTED,
        "containerStatuses": [
            {"name": c, "state": {"running": {"startedAt": STARTED}}, "lastState": {}, "ready": True,
             "restartCount": 0, "image": f"registry.example.com/{c}:2.14.{i % 5}",
             "imageID": f"registry.example.com/{c}@sha256:{i:064x}",
             "containerID": f"containerd://{(i * 3 + k + 1):064x}", "started": True}
            for k, c in enumerate(CONTAINERS)
        ],
        "qosClass": "Burstable",
    }
