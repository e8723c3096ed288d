"""Who holds or uses a GPU: containers named by the kubelet, pod-resources, or only by their
cgroup, and Slurm jobs named by their processes' cgroups."""

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Tuple

from gpu_monitoring.kube.pod_list import TERMINAL_PHASES, ContainerInfo, PodInfo
from gpu_monitoring.snapshot import Allocation, Process, SlurmJob

HolderKey = Tuple[str, ...]
Tagger = Callable[[str], List[str]]


@dataclass
class Holder:
    key: HolderKey
    namespace: Optional[str] = None
    pod: Optional[str] = None
    container: Optional[str] = None
    container_id: Optional[str] = None
    pod_uid: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    slurm: Optional[SlurmJob] = None  # a Slurm job holds it: the job's tags, not a container's
    phase: Optional[str] = None  # the pod's phase, where the kubelet lists it

    @property
    def finished(self) -> bool:
        """Its pod is Succeeded or Failed: it holds nothing, whatever its processes left behind."""
        return self.phase in TERMINAL_PHASES

    def tags(self, tagger: Tagger) -> List[str]:
        """The Agent tagger's tags when it knows the container (they carry the user's pod-label
        tags); otherwise the pod and container names we have. A Slurm job's own tags."""
        if self.slurm:
            return _job_tags(self.slurm)
        if self.container_id:
            known = tagger(f"container_id://{self.container_id}")
            if known:
                return sorted(known)
        tags = {
            "pod_name": self.pod,
            "kube_namespace": self.namespace,
            "kube_container_name": self.container,
            "container_id": self.container_id,
        }
        return [f"{key}:{value}" for key, value in tags.items() if value]


class PodDirectory:
    """The kubelet's pods, looked up by name or by container ID; empty when the kubelet is unknown."""

    def __init__(self, pods: Optional[List[PodInfo]]):
        self._by_name: Dict[Tuple[str, str], PodInfo] = {}
        self._by_container_id: Dict[str, Tuple[PodInfo, ContainerInfo]] = {}
        for pod in pods or []:
            self._by_name[(pod.namespace, pod.name)] = pod
            for container in pod.containers:
                if container.container_id:
                    self._by_container_id[container.container_id] = (pod, container)

    def is_terminal(self, namespace: str, pod: str) -> bool:
        known = self._by_name.get((namespace, pod))
        return bool(known and known.terminal)

    def controller_kind(self, namespace: str, pod: str) -> Optional[str]:
        """What controls the pod (`DaemonSet`, `ReplicaSet`...); None for a bare pod or one the kubelet did not list."""
        known = self._by_name.get((namespace, pod))
        return known.controller_kind if known else None

    def for_allocation(self, allocation: Allocation) -> Holder:
        key = ("pod", allocation.namespace, allocation.pod, allocation.container)
        pod = self._by_name.get((allocation.namespace, allocation.pod))
        container = next((c for c in pod.containers if c.name == allocation.container), None) if pod else None
        if not (pod and container):
            return Holder(key=key, namespace=allocation.namespace, pod=allocation.pod, container=allocation.container)
        return Holder(
            key=key,
            namespace=allocation.namespace,
            pod=allocation.pod,
            container=allocation.container,
            container_id=container.container_id,
            pod_uid=pod.uid,
            env=dict(container.env),
            phase=pod.phase,
        )

    def for_process(self, process: Process) -> Optional[Holder]:
        if process.slurm:
            # The job is the innermost owner: slurmd may itself run in a pod.
            return Holder(key=("slurm", process.slurm.job_id), slurm=replace(process.slurm, step=None))
        if not process.container_id:
            return None
        found = self._by_container_id.get(process.container_id)
        if found is None:
            return Holder(key=("container", process.container_id), container_id=process.container_id,
                          pod_uid=process.pod_uid)
        pod, container = found
        return Holder(
            key=("pod", pod.namespace, pod.name, container.name),
            namespace=pod.namespace,
            pod=pod.name,
            container=container.name,
            container_id=container.container_id,
            pod_uid=pod.uid,
            env=dict(container.env),
            phase=pod.phase,
        )


def _job_tags(job: SlurmJob) -> List[str]:
    """A job's tags, for all its steps; a process's own step is a tag of the process."""
    tags = {
        "slurm_job_id": job.job_id,
        "slurm_job_name": job.name,
        "slurm_partition": job.partition,
        "slurm_account": job.account,
        "slurm_user": job.user,
        "slurm_uid": job.uid,
    }
    return [f"{key}:{value}" for key, value in tags.items() if value is not None]
