"""Requests the check makes of the kubelet (`/pods`) and of pod-resources, from the simulated servers' counters.

The pod cache's TTL is real (monotonic) time, so the check runs back to back for a few TTLs:
it may ask the kubelet, and pod-resources, once in each TTL window that began, never more.
"""

import math
import time
from dataclasses import dataclass

from .harness import Bench, per


@dataclass
class KubeRequests:
    ttl: float
    elapsed: float
    runs: int
    kubelet: int
    pod_resources: int

    @property
    def windows(self) -> int:
        """TTL windows that began while the runs went on."""
        return max(1, math.ceil(self.elapsed / self.ttl))

    @property
    def kubelet_per_ttl(self) -> float:
        return per(self.kubelet, self.windows)

    @property
    def pod_resources_per_run(self) -> float:
        return per(self.pod_resources, self.runs)

    @property
    def pod_resources_per_ttl(self) -> float:
        return per(self.pod_resources, self.windows)


def count_requests(scenario: str, ttl: float, seconds: float) -> KubeRequests:
    with Bench(scenario, pod_cache_ttl=ttl) as bench:
        bench.warm_up(1)  # the first run asks both; the steady runs after it are counted
        kubelet, resources = bench.kubernetes_requests()
        runs, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            bench.run()
            runs += 1
        elapsed = time.monotonic() - started
        kubelet_now, resources_now = bench.kubernetes_requests()
    return KubeRequests(ttl, elapsed, runs, kubelet_now - kubelet, resources_now - resources)
