"""What Kubernetes says of this node's GPUs: the kubelet's pods beside pod-resources' allocations, and how
both fared, as the kubelet service check's status and reason."""

from typing import List, Optional, Set, Tuple

from gpu_monitoring.kube.allocations import AllocationReader
from gpu_monitoring.kube.kubelet import KubeletClient, KubeletError
from gpu_monitoring.kube.pod_list import PodInfo
from gpu_monitoring.snapshot import Allocations
from gpu_monitoring.status import Status

State = Tuple[Status, Optional[str]]


class NodePods:
    """`allocations` is None in sidecar mode, where the sidecar reads pod-resources."""

    def __init__(self, kubelet: KubeletClient, allocations: Optional[AllocationReader]):
        self.kubelet = kubelet
        self.allocations = allocations
        self._told: Set[str] = set()

    def read(self, allocations: Allocations) -> Tuple[Optional[List[PodInfo]], State]:
        """The kubelet's pods (None when it can't be read), and what the kubelet service check says of how
        the kubelet and pod-resources (as `allocations` tells) answered."""
        problems: List[Tuple[Status, str]] = []
        pods = None
        try:
            pods = self.kubelet.pods()
        except KubeletError as e:
            problems.append((e.status, f"kubelet: {e}; pods are named from pod-resources alone, "
                                       "without their phase, container IDs or MPS limits"))
        if allocations.source == "error":
            problems.append((Status.WARNING, f"pod-resources: {allocations.error}; "
                                             "GPUs running a compute process count as allocated until it answers"))
        elif allocations.advertised_error:
            # WARNING, as for pod-resources' other failures: the Agent drops an OK check's message,
            # and shares on shared GPUs are overstated until a kubelet (1.23+) advertises replicas.
            problems.append((Status.WARNING, f"pod-resources: {allocations.advertised_error}; shared GPUs are cut "
                                             "by the replicas pods hold (highest ID + 1), not those the device plugin "
                                             "advertises, which overstates each pod's share while replicas are free"))
        status = max((s for s, _ in problems), default=Status.OK)
        return pods, (status, "; ".join(m for _, m in problems) or None)

    def read_without_gpus(self) -> Optional[State]:
        """No GPU could be read this run. In local mode pod-resources is still read, so that the kubelet
        service check tells what Kubernetes attribution lacks before the GPUs come back."""
        if self.allocations is None:
            return None
        return self.read(self.allocations.read())[1]

    def new_problems(self, problems: List[str]) -> List[str]:
        """Allocations that point at no GPU, each told once, not every run."""
        new = sorted(set(problems) - self._told)
        self._told = set(problems)
        return new
