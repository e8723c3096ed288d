"""The rest of a simulated node: its proc root and, for a scenario with pods, a real kubelet and
pod-resources socket. A scenario's `slurm` jobs (see simulator.slurm) place processes in jobs.

A scenario's `kubernetes.pods` lists pods, their containers, the devices each container was
given and the GPU processes it runs:

    kubernetes:
      version: "1.34"                     # default; from 1.27 to 1.30 DRA claims are told by CDI names alone
      device_plugin: true                 # default; false: GetAllocatableResources lists no GPU (DRA alone)
      node_name: gpu-node-0               # the DRA driver's pool (default: the scenario's name)
      pods:
        - name: trainer-0
          namespace: ml
          phase: Running                  # default
          labels: {app: trainer}
          owner: {kind: Job, name: trainer}  # the controlling owner the kubelet lists in ownerReferences
          containers:
            - name: trainer
              resource: nvidia.com/gpu    # default
              devices: [gpu:0, gpu:1]     # gpu:N, gpu:N::R, mig:N/GI, mig-legacy:N/GI/CI,
                                          # gke:N, gke:N/vgpuK, gke:N/giM, or a literal ID
              processes: [41021]          # pids of the scenario's GPU processes
              env: {CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: "25"}
              runtime: containerd         # or crio, docker; cgroup_driver and cgroup_version too
              cgroup: {cpu_quota: 4, throttled_percent: 62}  # what its cgroup shows (simulator.cgroup_tree:
                                          # cpu_quota, throttled_percent, cpu_cores_used, io_some_avg10,
                                          # memory_some_avg10)
              claims:                     # DRA claims: each device as NVIDIA's DRA driver names it
                - name: trainer-0-gpus    # namespace: the pod's by default
                  devices: [gpu:0, mig:3/9] # gpu:N (gpu-<minor>), mig:N/GI (gpu-<minor>-mig-<profile>-<profile
                                          # id>-<start>), mig-sized:N/GI (older drivers: gpu-<minor>-mig-<profile
                                          # id>-<start>-<size>; both need the instance's profile_id and placement)
                                          # or a literal name
                  driver: gpu.nvidia.com  # default
                  share_id: 6f1e1c52-...  # a share of the device (consumable capacity)
      advertised:                         # shared GPUs: every replica the device plugin advertises
        - {device: 0, resource: nvidia.com/gpu.shared, replicas: 8}

GetAllocatableResources advertises those replicas, every ID a container holds, and each other
GPU whole (`nvidia.com/gpu`) or, with MIG on, each of its instances (`nvidia.com/mig-<profile>`).

A scenario's `dcgm_exporter` block (simulator.scenario) runs dcgm-exporter on the node, as the
NVIDIA GPU Operator deploys it: its DaemonSet's pod is in the kubelet's pod list, where the check
finds it; it names the pods that hold each GPU or MIG instance, as dcgm-exporter's pod mapper does.

`simulated_node()` makes a node from a scenario, reading nothing but the scenario and starting
nothing. `start()` writes the proc root, the sysfs (every scenario has both: simulator.sysfs_root; its
`fs/cgroup` holds each workload's cgroup: simulator.cgroup_tree) and the kernel's log (simulator.kernel_log),
starts dcgm-exporter, the HTTPS kubelet and the gRPC socket in a temporary directory and returns the
instance options that point the check at them; `stop()` ends them all and removes the directory. The
sysfs (its cgroups' counters too) follows scenario time to the second and the kernel's log to the fault:
the simulated library tells the node when time moved (at the first NVML call of a check run, or an
advance), and the node rewrites what changed.

The node booted BOOT_UPTIME seconds before scenario time 0, at `boot_time` (seconds since the epoch, the
proc root's `stat` btime); `wall_time()` is the epoch time the scenario's present stands for.
A model's `hourly_price` stands in for the instance's `hourly_price`, so that the demo shows cost;
an instance that sets `hourly_price` replaces the scenario's prices.
"""

import hashlib
import math
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from gpu_monitoring.kube.cdi_devices import GPU_DRIVER
from gpu_monitoring.kube.device_ids import DeviceRef, parse_device_id
from gpu_monitoring.simulator.cgroup_tree import CgroupTree, scenario_workloads
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.dcgm_exporter_server import DcgmExporterServer, EntityKey, Holder
from gpu_monitoring.simulator.kernel_log import BOOT_UPTIME, KernelLog
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.pod_resources_server import PodResourcesServer
from gpu_monitoring.simulator.proc_root import boot_id_of, build_proc_root
from gpu_monitoring.simulator.scenario import load
from gpu_monitoring.simulator.slurm import slurm_cpu_processes, slurm_processes, write_slurm_cgroups
from gpu_monitoring.simulator.sysfs_root import SysfsTree
from gpu_monitoring.snapshot import Advertised, Allocation

# The kubelet's HTTPS server (and the TLS library it brings, several MiB) is loaded only by a node
# that serves it: a sidecar reads pod-resources alone.
if TYPE_CHECKING:
    from gpu_monitoring.simulator.kubelet_server import KubeletServer

_CGROUP_KEYS = ("runtime", "cgroup_driver", "cgroup_version", "qos")
# The GPU Operator's dcgm-exporter DaemonSet (NVIDIA/gpu-operator assets/state-dcgm-exporter): its
# pod's label and container, in the operator's namespace, with a DaemonSet pod's generated suffix.
EXPORTER_POD = "nvidia-dcgm-exporter-7kq2x"
EXPORTER_NAMESPACE = "gpu-operator"
EXPORTER_LABELS = {"app": "nvidia-dcgm-exporter"}
EXPORTER_OWNER = {"kind": "DaemonSet", "name": "nvidia-dcgm-exporter"}
EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"


def simulated_node(scenario: str, clock: Optional[SimClock] = None) -> "SimulatedNode":
    """The node a scenario (a name or a YAML path) describes, on `clock` (by default one that
    follows wall time from now), not started. Raises ScenarioError for a scenario that cannot be loaded."""
    return SimulatedNode(SimulatedNvml(load(scenario), clock))


class SimulatedNode:
    def __init__(self, nvml: SimulatedNvml):
        self.nvml = nvml
        kubernetes = nvml.scenario.extra.get("kubernetes", {})
        self.pods = [_pod(p) for p in kubernetes.get("pods", [])]
        self.shared = kubernetes.get("advertised", [])
        self.kubernetes_version = str(kubernetes.get("version", "1.34"))
        self.device_plugin = bool(kubernetes.get("device_plugin", True))
        self.node_name = kubernetes.get("node_name", nvml.scenario.name)
        self._directory: Optional[tempfile.TemporaryDirectory] = None
        self.kubelet: Optional[KubeletServer] = None
        self.pod_resources: Optional[PodResourcesServer] = None
        self.dcgm_exporter: Optional[DcgmExporterServer] = None
        self.sysfs: Optional[SysfsTree] = None
        self.cgroups: Optional[CgroupTree] = None
        self._sysfs_second: Optional[int] = None
        self.kernel_log: Optional[KernelLog] = None
        self.boot_time: int = int(time.time() - nvml.clock.now()) - BOOT_UPTIME
        nvml.on_time(self._time_moved)

    def wall_time(self) -> float:
        """The time since the epoch that the scenario's present stands for."""
        return self.boot_time + BOOT_UPTIME + self.nvml.now()

    def start(self, serve_kubernetes: bool = True, serve_kubelet: bool = True) -> Dict[str, Any]:
        """Write the proc root and, when asked and the scenario has pods, serve the kubelet's APIs:
        pod-resources, and `/pods` over HTTPS unless `serve_kubelet` is False."""
        self._directory = tempfile.TemporaryDirectory(prefix="gpu-monitoring-node-")
        try:
            return self._serve(Path(self._directory.name), serve_kubernetes, serve_kubelet)
        except BaseException:
            # A check starts its node on a run, and tries again on the next: leave nothing behind.
            self.stop()
            raise

    def _serve(self, root: Path, serve_kubernetes: bool, serve_kubelet: bool) -> Dict[str, Any]:
        scenario = self.nvml.scenario
        proc_root = build_proc_root(root / "proc", self._processes(), scenario.devices, boot_id_of(scenario.name),
                                    self.boot_time)
        standing_in = {"proc_root": str(proc_root), "sysfs_root": str(self._write_sysfs(root / "sys")),
                       "kernel_log": str(self._write_kernel_log(root / "kmsg"))}
        prices = self.prices()
        if prices:
            standing_in["hourly_price"] = prices
        if scenario.node.expected_gpus is not None:
            standing_in["expected_gpus"] = scenario.node.expected_gpus
        spec = self.nvml.scenario.dcgm_exporter
        if spec is not None:
            self.dcgm_exporter = DcgmExporterServer(self.nvml, spec, self.exporter_holders()).start()
        if not (serve_kubernetes and self.pods):
            return dict(standing_in, kubernetes="false")
        socket_path = str(root / "kubelet.sock")
        self.pod_resources = PodResourcesServer(socket_path, self.allocations(), self.advertised(),
                                                kubernetes_version=self.kubernetes_version).start()
        standing_in.update(kubernetes="true", pod_resources_socket=socket_path)
        if serve_kubelet:
            standing_in.update(self._serve_kubelet(root))
        return standing_in

    def _serve_kubelet(self, root: Path) -> Dict[str, str]:
        from gpu_monitoring.simulator.kubelet_server import KubeletServer

        self.kubelet = KubeletServer(pods=self._kubelet_pods(), directory=str(root)).start()
        self.kubelet.write_token_file()
        return {"kubelet_url": self.kubelet.url, "kubelet_token_path": self.kubelet.token_path,
                "kubelet_ca_path": self.kubelet.ca_path}

    def _write_sysfs(self, root: Path) -> Path:
        sysfs = SysfsTree(root, self.nvml.scenario)
        now = self.nvml.now()
        sysfs.build(now)
        self.cgroups = CgroupTree(root, scenario_workloads(self.pods, self._slurm()))
        self.cgroups.build(now)
        write_slurm_cgroups(root / "fs" / "cgroup", self._slurm(), self.minor_numbers())
        self.sysfs, self._sysfs_second = sysfs, math.floor(now)
        return root

    def _write_kernel_log(self, path: Path) -> Path:
        kernel_log = KernelLog(path, self.nvml.scenario)
        kernel_log.start(self.nvml.now())
        self.kernel_log = kernel_log
        return path

    def _time_moved(self, now: float) -> None:
        """Add the kernel's records of the faults that fired by `now`, and bring the sysfs to `now` once a
        second of scenario time at most: a check reading it every few seconds cannot tell, and a clock that
        follows wall time moves at every NVML call."""
        if self.kernel_log is not None:
            self.kernel_log.advance(now)
        if self.sysfs is not None and math.floor(now) != self._sysfs_second:
            self._sysfs_second = math.floor(now)
            self.sysfs.update(now)
            if self.cgroups is not None:
                self.cgroups.update(now)

    def prices(self) -> Dict[str, float]:
        """US$ per GPU-hour by NVML product name, from the scenario's models."""
        return {
            device.spec["name"]: float(device.spec["hourly_price"])
            for device in self.nvml.devices
            if device.spec.get("hourly_price") is not None
        }

    def stop(self) -> None:
        for server in (self.pod_resources, self.kubelet, self.dcgm_exporter):
            if server is not None:
                server.stop()
        self.sysfs = self.kernel_log = self.cgroups = None
        if self._directory is not None:
            self._directory.cleanup()
        self.kubelet = self.pod_resources = self.dcgm_exporter = self._directory = None

    # --- what the servers serve -------------------------------------------------------

    def allocations(self) -> List[Allocation]:
        """Each container's devices from device plugins, then from its DRA claims, as pod-resources lists them."""
        return [allocation for pod in self.pods for c in pod["containers"] for allocation in self._held(pod, c)]

    def _held(self, pod: Dict[str, Any], container: Dict[str, Any]) -> List[Allocation]:
        where = (pod["namespace"], pod["name"], container["name"])
        plugged = [Allocation(*where, container.get("resource", "nvidia.com/gpu"), self.device_id(ref))
                   for ref in container.get("devices", [])]
        return plugged + [
            Allocation(*where, claim.get("driver", GPU_DRIVER), self.dra_device(ref), claim_name=claim["name"],
                       claim_namespace=claim.get("namespace", pod["namespace"]), pool=self.node_name,
                       share_id=claim.get("share_id"))
            for claim in container.get("claims", [])
            for ref in claim["devices"]
        ]

    def advertised(self) -> List[Advertised]:
        """What the device plugins advertise: declared replicas, held IDs, and every other GPU whole; nothing
        on a node without them (DRA devices are not advertised there)."""
        if not self.device_plugin:
            return []
        held = [a for a in self.allocations() if not a.dynamic]
        found = {a.device_id: Advertised(a.resource_name, a.device_id) for a in held}
        for shared in self.shared:
            for replica in range(int(shared["replicas"])):
                device_id = self.device_id(f"gpu:{shared['device']}::{replica}")
                found.setdefault(device_id, Advertised(shared.get("resource", "nvidia.com/gpu"), device_id))
        refs = [ref for ref in map(_parsed, found) if ref is not None]
        for device in self.nvml.devices:
            if not any(_names(ref, device) for ref in refs):
                found.update((device_id, Advertised(resource, device_id)) for resource, device_id in _whole(device))
        return list(found.values())

    def exporter_holders(self) -> Dict[EntityKey, Holder]:
        """The pod dcgm-exporter names on each GPU or GPU instance: the first to hold it (its pod
        mapper keeps one pod per device)."""
        holders: Dict[EntityKey, Holder] = {}
        for pod in self.pods:
            for c in pod["containers"]:
                for ref in c.get("devices", []):
                    key = _entity(ref)
                    if key is not None:
                        holders.setdefault(key, (pod["namespace"], pod["name"], c["name"]))
        return holders

    def _kubelet_pods(self) -> List[Dict[str, Any]]:
        return self._scenario_pods() + ([self._exporter_pod()] if self.dcgm_exporter else [])

    def _exporter_pod(self) -> Dict[str, Any]:
        return {
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod/{EXPORTER_NAMESPACE}/{EXPORTER_POD}")),
            "name": EXPORTER_POD,
            "namespace": EXPORTER_NAMESPACE,
            "phase": "Running",
            "labels": EXPORTER_LABELS,
            "owner": EXPORTER_OWNER,
            "pod_ip": "127.0.0.1",
            "containers": [{
                "name": "nvidia-dcgm-exporter",
                "container_id": _container_id(EXPORTER_NAMESPACE, EXPORTER_POD, "nvidia-dcgm-exporter"),
                "image": EXPORTER_IMAGE,
                "env": {"DCGM_EXPORTER_LISTEN": f":{self.dcgm_exporter.port}", "DCGM_EXPORTER_KUBERNETES": "true"},
                "ports": [{"name": "metrics", "containerPort": self.dcgm_exporter.port, "protocol": "TCP"}],
            }],
        }

    def _scenario_pods(self) -> List[Dict[str, Any]]:
        return [
            {
                "uid": pod["uid"],
                "name": pod["name"],
                "namespace": pod["namespace"],
                "phase": pod["phase"],
                "labels": pod.get("labels", {}),
                "owner": pod.get("owner"),
                "containers": [
                    {
                        "name": c["name"],
                        "container_id": c["container_id"],
                        "runtime": c.get("runtime", "containerd"),
                        "env": c.get("env", {}),
                        "limits": {c.get("resource", "nvidia.com/gpu"): str(len(c.get("devices", [])))}
                        if c.get("devices") else {},
                    }
                    for c in pod["containers"]
                ],
            }
            for pod in self.pods
        ]

    def _processes(self) -> List[Dict[str, Any]]:
        owners = {
            pid: dict({k: c[k] for k in _CGROUP_KEYS if k in c}, container_id=c["container_id"], pod_uid=pod["uid"])
            for pod in self.pods
            for c in pod["containers"]
            for pid in c.get("processes", [])
        }
        owners.update(slurm_processes(self._slurm(), self.minor_numbers()))
        found = {}
        for device in self.nvml.devices:
            for process in device.spec.processes + [p for m in device.spec.mig for p in m.processes]:
                found[process["pid"]] = dict(owners.get(process["pid"], {}), pid=process["pid"],
                                             name=process.get("name", "python3"), state=process.get("state", "S"))
        return list(found.values()) + slurm_cpu_processes(self._slurm(), self.minor_numbers())

    def _slurm(self) -> Dict[str, Any]:
        return self.nvml.scenario.extra.get("slurm", {})

    def minor_numbers(self) -> List[int]:
        """The devices' NVML minor numbers, by index: a scenario's `minor_number`, else the index."""
        return [device.spec.get("minor_number", device.index) for device in self.nvml.devices]

    def device_id(self, ref: str) -> str:
        """The kubelet's ID for a scenario reference (gpu:N, mig:N/GI, gke:N/vgpuK, ...)."""
        kind, _, rest = ref.partition(":")
        if kind not in ("gpu", "mig", "mig-legacy", "gke"):
            return ref
        index, _, tail = rest.partition("/")
        index, _, replica = index.partition("::")
        device = self.nvml.devices[int(index)]
        if kind == "gpu":
            return device.spec.uuid + (f"::{replica}" if replica else "")
        if kind == "mig":
            return next(m.spec.uuid for m in device.mig if m.spec.gpu_instance_id == int(tail))
        if kind == "mig-legacy":
            return f"MIG-{device.spec.uuid}/{tail}"
        minor = device.spec.get("minor_number", device.index)
        return f"nvidia{minor}" + (f"/{tail}" if tail else "")

    def dra_device(self, ref: str) -> str:
        """The device name NVIDIA's DRA driver gives a scenario reference (gpu:N, mig:N/GI, mig-sized:N/GI),
        by NVML minor number and MIG placement (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin: deviceinfo.go
        `gpu-%d`, mig.go ToCanonicalName; before its dynamic MIG releases, deviceinfo.go `gpu-%d-mig-%d-%d-%d`)."""
        kind, _, rest = ref.partition(":")
        if kind not in ("gpu", "mig", "mig-sized"):
            return ref
        index, _, gpu_instance = rest.partition("/")
        device = self.nvml.devices[int(index)]
        name = f"gpu-{device.spec.get('minor_number', device.index)}"
        if kind == "gpu":
            return name
        spec = next(m.spec for m in device.mig if m.spec.gpu_instance_id == int(gpu_instance))
        if spec.profile_id is None or spec.placement is None:
            raise ValueError(f"claim device {ref}: the MIG instance needs profile_id and placement for its DRA name")
        start, size = spec.placement
        if kind == "mig-sized":
            return f"{name}-mig-{spec.profile_id}-{start}-{size}"
        # The profile name without dots, in lower case as a Kubernetes device name must be (RFC 1123).
        return f"{name}-mig-{spec.profile.replace('.', '').lower()}-{spec.profile_id}-{start}"


def _entity(ref: str) -> Optional[EntityKey]:
    """The GPU (gpu:N, gpu:N::R) or GPU instance (mig:N/GI, mig-legacy:N/GI/CI) a scenario reference names."""
    kind, _, rest = ref.partition(":")
    index, _, tail = rest.partition("/")
    index = index.partition("::")[0]
    if kind == "gpu":
        return int(index), None
    if kind in ("mig", "mig-legacy"):
        return int(index), int(tail.partition("/")[0])
    return None


def _parsed(device_id: str) -> Optional[DeviceRef]:
    try:
        return parse_device_id(device_id)
    except ValueError:
        return None  # another vendor's device, or a scenario's deliberately bogus ID


def _names(ref: DeviceRef, device: Any) -> bool:
    uuids = {device.spec.uuid} | {m.spec.uuid for m in device.mig}
    return ref.uuid in uuids or (ref.minor is not None and ref.minor == device.spec.get("minor_number", device.index))


def _whole(device: Any) -> List[Tuple[str, str]]:
    if device.mig:
        return [(f"nvidia.com/mig-{m.spec.profile}", m.spec.uuid) for m in device.mig]
    return [("nvidia.com/gpu", device.spec.uuid)]


def _pod(raw: Mapping[str, Any]) -> Dict[str, Any]:
    namespace = raw.get("namespace", "default")
    pod = dict(raw, namespace=namespace, phase=raw.get("phase", "Running"))
    pod["uid"] = raw.get("uid") or str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod/{namespace}/{raw['name']}"))
    pod["containers"] = [
        dict(c, container_id=c.get("container_id") or _container_id(namespace, raw["name"], c["name"]))
        for c in raw.get("containers", [])
    ]
    return pod


def _container_id(namespace: str, pod: str, container: str) -> str:
    return hashlib.sha256(f"{namespace}/{pod}/{container}".encode()).hexdigest()
