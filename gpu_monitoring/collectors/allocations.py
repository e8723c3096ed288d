"""Which devices the kubelet gave which containers, from its pod-resources socket."""

from typing import Iterable

from ..kube.device_ids import DEFAULT_RESOURCES
from ..kube.pod_resources import PodResourcesError, list_allocations
from ..snapshot import Allocations


class AllocationReader:
    """Reads pod-resources each collection; a failure is data (source `error`), never an exception."""

    def __init__(self, socket_path: str, extra_resources: Iterable[str] = (), timeout: float = 5.0):
        self.socket_path = socket_path
        self.patterns = tuple(DEFAULT_RESOURCES) + tuple(extra_resources)
        self.timeout = timeout

    def read(self) -> Allocations:
        try:
            found = list_allocations(self.socket_path, self.patterns, self.timeout)
        except PodResourcesError as e:
            return Allocations(source="error", error=str(e))
        return Allocations(source="pod_resources", items=found)
