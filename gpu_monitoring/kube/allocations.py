"""Which devices the kubelet gave which containers, and which it can give, from its pod-resources socket."""

import dataclasses
import time
from typing import Callable, FrozenSet, Hashable, Iterable, List, Optional, Set, Tuple

from gpu_monitoring.kube.device_ids import DEFAULT_RESOURCES
from gpu_monitoring.kube.pod_resources import LastAnswer, PodResourcesError, list_allocatable, list_allocations
from gpu_monitoring.snapshot import Advertised, Allocation, Allocations

# What the device plugins advertise changes when a plugin restarts or reconfigures, not from run to run.
ADVERTISED_TTL = 300.0


class AllocationReader:
    """Reads pod-resources; a failure is data (source `error`), never an exception.

    An answer is kept for `ttl` seconds (0: every collection asks), as the kubelet's pods are, and
    asked again sooner when the collection says the GPUs' users changed: a container that starts
    or ends on a GPU shows there first. A failure is not kept: the next collection asks again.

    The advertised devices are read again after ADVERTISED_TTL seconds, or sooner when a container
    holds an ID they lacked at the last read (the plugin changed). An ID still missing after that
    read (a device the plugin now calls unhealthy) asks no more; nor does a kubelet that does not
    serve them, until the TTL."""

    def __init__(
        self,
        socket_path: str,
        extra_resources: Iterable[str] = (),
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        ttl: float = 0.0,
    ):
        self.socket_path = socket_path
        self.patterns = tuple(DEFAULT_RESOURCES) + tuple(extra_resources)
        self.timeout = timeout
        self.ttl = ttl
        self._clock = clock
        self._kept: Optional[Tuple[float, Hashable, Allocations]] = None  # when asked, the users then, the answer
        self._advertised: Optional[List[Advertised]] = None
        self._advertised_error: Optional[str] = None
        self._read_at: Optional[float] = None
        self._unexplained: Set[str] = set()
        self._advertised_ids: Tuple[Optional[List[Advertised]], FrozenSet[str]] = (None, frozenset())
        self._last_allocations: LastAnswer[Allocation] = LastAnswer()
        self._last_advertised: LastAnswer[Advertised] = LastAnswer()

    def read(self, users: Hashable = None) -> Allocations:
        """What pod-resources says now, or within the TTL while `users` (who runs on which GPU, as the
        caller tells it) stay what they were. Callers may change what they get: it is theirs."""
        now = self._clock()
        kept = self._kept
        if kept is None or kept[1] != users or now - kept[0] >= self.ttl:
            kept = self._kept = now, users, self._ask()
        answer = kept[2]
        if answer.source == "error":
            self._kept = None
        return dataclasses.replace(answer, items=list(answer.items))

    def _ask(self) -> Allocations:
        try:
            found = list_allocations(self.socket_path, self.patterns, self.timeout, self._last_allocations)
        except PodResourcesError as e:
            return Allocations(source="error", error=str(e))
        if self._stale(found):
            self._read_advertised(found)
        return Allocations(source="pod_resources", items=found, advertised=self._advertised,
                           advertised_error=self._advertised_error)

    def _stale(self, held: List[Allocation]) -> bool:
        if self._read_at is None or self._clock() - self._read_at >= ADVERTISED_TTL:
            return True
        return bool(self._not_advertised(held) - self._unexplained)

    def _not_advertised(self, held: List[Allocation]) -> Set[str]:
        if self._advertised is None:
            return set()
        if self._advertised_ids[0] is not self._advertised:  # asked every run, changed per TTL
            self._advertised_ids = (self._advertised, frozenset(a.device_id for a in self._advertised))
        return {a.device_id for a in held}.difference(self._advertised_ids[1])

    def _read_advertised(self, held: List[Allocation]) -> None:
        self._read_at = self._clock()
        try:
            self._advertised = list_allocatable(self.socket_path, self.patterns, self.timeout, self._last_advertised)
            self._advertised_error = None
        except PodResourcesError as e:
            self._failed(e)
        self._unexplained = self._not_advertised(held)

    def _failed(self, error: PodResourcesError) -> None:
        """An old kubelet stays old until the TTL; a passing failure (timeout, rate limit) is tried
        again next run, keeping what the last good answer said meanwhile."""
        if error.reason != "unimplemented":
            self._read_at = None
            if self._advertised is not None:
                return
        self._advertised, self._advertised_error = None, str(error)
