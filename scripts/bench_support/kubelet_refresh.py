"""What a kubelet refresh costs the check on a full node: the check's kubelet client asks the
110-pod node's HTTPS kubelet (`full_node`) for `/pods` and turns the answer into its pod list.
CPU is the asking thread's own (`time.thread_time`); the kubelet answers on threads of its own.

Three kinds of call: a refresh whose pods are those of the last (in a new order, as the kubelet
lists them), a refresh after one pod changed, and a call within `pod_cache_ttl` that asks nothing.
At the Agent's 15-second interval and the default 30-second TTL every other run refreshes.
"""

import statistics
import time
from dataclasses import dataclass
from typing import Callable, List

from gpu_monitoring.kube import DEFAULT_TTL
from gpu_monitoring.kube.kubelet import KubeletClient
from gpu_monitoring.net.agent_http import AgentHttp

from .full_node import PODS, FullNodeKubelet
from .harness import INTERVAL
from .refresh import REFRESHING_SHARE
from .report import Report, Table

REFRESHES = 60
UNCHANGED_LIMIT_MS = 4.0
CHANGED_LIMIT_MS = 12.0


@dataclass
class RefreshFigures:
    answer_bytes: int
    unchanged_ms: float
    changed_ms: float
    cached_ms: float

    def per_run(self, refresh_ms: float) -> float:
        """The average CPU per run at the Agent's interval: refreshing runs and runs within the TTL."""
        return REFRESHING_SHARE * refresh_ms + (1 - REFRESHING_SHARE) * self.cached_ms


def _median_ms(call: Callable[[], object], before: Callable[[], None], times: int) -> float:
    spent: List[float] = []
    for _ in range(times):
        before()
        started = time.thread_time()
        call()
        spent.append((time.thread_time() - started) * 1000)
    return statistics.median(spent)


def measure(refreshes: int = REFRESHES) -> RefreshFigures:
    with FullNodeKubelet() as kubelet:
        refreshing = KubeletClient(kubelet.pods_url, kubelet.token_path, kubelet.ca_path, ttl=0, http=AgentHttp)
        cached = KubeletClient(kubelet.pods_url, kubelet.token_path, kubelet.ca_path, ttl=3600, http=AgentHttp)
        for client in (refreshing, cached):
            if len(client.pods()) != PODS:  # the first read builds every pod's record
                raise RuntimeError("the full node's kubelet did not answer with its pods")
        return RefreshFigures(
            answer_bytes=len(kubelet.body()),
            unchanged_ms=_median_ms(refreshing.pods, lambda: None, refreshes),
            changed_ms=_median_ms(refreshing.pods, kubelet.touch, refreshes),
            cached_ms=_median_ms(cached.pods, lambda: None, refreshes),
        )


def table(report: Report, refreshes: int = REFRESHES) -> Table:
    figures = measure(refreshes)
    unchanged = report.target(f"CPU per kubelet refresh, {PODS} pods, none changed", figures.unchanged_ms,
                              f"<= {UNCHANGED_LIMIT_MS:g} ms", figures.unchanged_ms <= UNCHANGED_LIMIT_MS)
    changed = report.target(f"CPU per kubelet refresh, {PODS} pods, one changed", figures.changed_ms,
                            f"<= {CHANGED_LIMIT_MS:g} ms", figures.changed_ms <= CHANGED_LIMIT_MS)
    average = f"average per run at a {INTERVAL} s interval, pod_cache_ttl {DEFAULT_TTL:g} s"
    return Table(
        f"A kubelet refresh on a full node: {PODS} pods, {figures.answer_bytes / 1e6:.2f} MB of /pods over HTTPS "
        f"(median CPU of {refreshes} calls, ms of the check's thread)",
        ["call", "CPU ms", average, "verdict"],
        [["refresh, the same pods in a new order", figures.unchanged_ms, figures.per_run(figures.unchanged_ms),
          unchanged],
         ["refresh, one pod changed", figures.changed_ms, figures.per_run(figures.changed_ms), changed],
         ["within pod_cache_ttl (asks nothing)", figures.cached_ms, "", ""]],
        ["three containers a pod, 28 env vars each, labels, annotations, owner references, probes, conditions and "
         "container statuses; 8 pods hold a GPU, one is dcgm-exporter. The HTTPS exchange is in the figure: "
         "reading 1.5 MB through the Agent's HTTP wrapper is most of a refresh whose pods did not change"],
    )
