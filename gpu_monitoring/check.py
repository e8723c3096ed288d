"""The gpu_monitoring Agent check: one run reads the node, attributes its GPUs, judges and submits."""

import os
import time
from functools import cached_property, partial
from typing import TYPE_CHECKING, Callable, List, Optional, Union

from datadog_checks.base import AgentCheck, ConfigurationError
from datadog_checks.base.utils.tagging import tagger

from gpu_monitoring.attribution.capacity import PriceOf
from gpu_monitoring.attribution.fleet import hourly_price
from gpu_monitoring.attribution.pipeline import attribute
from gpu_monitoring.config.derived import Derived, derive
from gpu_monitoring.config_models import ConfigMixin
from gpu_monitoring.dcgm.outcome import state_of
from gpu_monitoring.dcgm.reader import DcgmReader
from gpu_monitoring.health.judge import Judge, Rules
from gpu_monitoring.health.node_health import NodeJudge
from gpu_monitoring.kube.allocations import AllocationReader
from gpu_monitoring.kube.kubelet import KubeletClient
from gpu_monitoring.kube.node_pods import NodePods
from gpu_monitoring.kube.pod_list import PodInfo
from gpu_monitoring.net.agent_http import AgentHttp
from gpu_monitoring.nvml.errors import NvmlError
from gpu_monitoring.service_check import ReasonedServiceCheck
from gpu_monitoring.sidecar.client import SidecarUnavailable
from gpu_monitoring.snapshot import Snapshot
from gpu_monitoring.sources import LocalSource, SidecarSource, open_source
from gpu_monitoring.status import Status
from gpu_monitoring.submission.submitter import Submitter

# pynvml and grpcio (local mode) and the simulator are imported where they are used: the Agent
# ships neither package, and sidecar mode needs neither.
if TYPE_CHECKING:
    from gpu_monitoring.simulator.node import SimulatedNode

CAN_CONNECT = "nvml.can_connect"
KUBELET_CAN_CONNECT = "kubelet.can_connect"
SIDECAR_CAN_CONNECT = "sidecar.can_connect"
DCGM_CAN_CONNECT = "dcgm.can_connect"


class GpuMonitoringCheck(AgentCheck, ConfigMixin):
    """Each run: the source's snapshot → attribution → verdicts → submission. What each step reads,
    judges or sends is its module's; this class opens them and hands each step's output to the next."""

    __NAMESPACE__ = "gpu_monitoring"

    def __init__(self, name, init_config, instances):
        super().__init__(name, init_config, instances)
        self.instance = self.instance or {}
        # The generated models check every option: the check reads them there (`self.config`), and what
        # it derives from them once in `self.derived`.
        self.load_configuration_models()
        self.derived = self._configure()
        self.tags: List[str] = list(self.config.tags or ())
        self.submitter = Submitter(self, self.tags, _orchestrator_tags, self.config.max_processes_per_device,
                                   self.derived.profile)
        # What the runs read from is opened by `start()`, on the first run: a constructor only parses.
        self.pods: Optional[NodePods] = None
        self.source: Optional[Union[LocalSource, SidecarSource]] = None
        self.dcgm: Optional[DcgmReader] = None
        self.price_of: Optional[PriceOf] = None

    def load_configuration_models(self, package_path=None):
        # The models live beside this module's package, not under it.
        super().load_configuration_models(package_path or "gpu_monitoring.config_models")

    def _configure(self) -> Derived:
        """What the options give; with `simulate`, also the simulated node, read from its scenario here with
        the other options (so that one that cannot be loaded is a configuration error) and started by `start()`."""
        simulate = self.config.simulate
        self.simulated_node: Optional[SimulatedNode] = _simulated_node(simulate) if simulate else None
        return derive(self.config)

    def start(self) -> None:
        """Open what the runs read: the first run does, or a caller that wants it sooner. A simulated
        node starts first, and what is derived points at what it stands in for (the proc root and prices,
        the kubelet and pod-resources when its scenario has pods); an instance's own values still win.
        """
        if self.simulated_node is not None:
            standing_in = self.simulated_node.start(serve_kubernetes=self.derived.kubernetes != "false")
            self.derived = derive(self.config, standing_in)
        derived = self.derived
        self.pods = self._node_pods() if self._on_kubernetes() else None
        self.source = open_source(
            derived, self.read_persistent_cache, self.write_persistent_cache,
            sidecar_socket=self.config.sidecar_socket if self.config.source == "sidecar" else None,
            library=self.simulated_node.nvml.library if self.simulated_node else None,
            library_path=self.config.nvml_library_path, allocations=self.pods.allocations if self.pods else None,
            clock=self._node_clock)
        self.dcgm = DcgmReader(self.config.dcgm_exporter_url)
        self.price_of = partial(hourly_price, prices=derived.hourly_price, default=self.config.default_hourly_price)

    @cached_property
    def judge(self) -> Judge:
        """Made when a run first judges, not by `start()`, which a caller may call sooner: the Agent gives a
        check its ID, which keys the persistent cache the judge's memory is kept in, after making it."""
        derived = self.derived
        node_judge = NodeJudge(derived.sysfs_root, derived.expected_gpus, self.config.expected_network_ports,
                               self.config.expected_network_rate, self.config.network_ports_exclude)
        rules = Rules(self.config.xid_ignore, self.config.temperature_margin, self.config.fault_hold,
                      self.config.fabric_registration_grace, derived.expected_gpus)
        return Judge(rules, node_judge, self.read_persistent_cache, self.write_persistent_cache)

    def _node_pods(self) -> NodePods:
        kubelet = KubeletClient(**self.derived.kubelet, http=AgentHttp)
        # In sidecar mode the sidecar reads pod-resources. Pods and their devices are kept as long as each
        # other: one TTL, one view of the node.
        allocations = None if self.config.source == "sidecar" else AllocationReader(
            self.derived.pod_resources_socket, self.config.gpu_resource_names, ttl=kubelet.ttl)
        return NodePods(kubelet, allocations)

    @property
    def _node_clock(self) -> Callable[[], float]:
        """The clock the node's counters, events and kernel log follow: a simulated node's own, the host's otherwise."""
        return self.simulated_node.wall_time if self.simulated_node is not None else time.time

    def _on_kubernetes(self) -> bool:
        if self.derived.kubernetes != "auto":
            return self.derived.kubernetes == "true"
        return os.path.exists(self.derived.pod_resources_socket) or "KUBERNETES_SERVICE_HOST" in os.environ

    def check(self, _instance) -> None:
        if self.source is None:
            self.start()
        snapshot = self._read_node()
        if snapshot is None:
            self._without_nvml()
            return
        self._report_versions(snapshot)
        self.judge.take_in(snapshot)
        pods = self._read_pods(snapshot)
        self._read_dcgm(snapshot, pods)
        attribution = attribute(snapshot, pods, self.config.effective_threshold, self.price_of,
                                self.derived.expected_gpus)
        healths = self.judge.gpus(snapshot, attribution)
        self.submitter.submit(snapshot, healths, attribution, self.judge.node(snapshot))
        self._submitted()
        if self.pods is not None:
            for problem in self.pods.new_problems(attribution.problems):
                self.warning("pod-resources: %s", problem)
        self.judge.remember(snapshot)

    def cancel(self) -> None:
        if self.source is not None:
            self.source.close()
        if self.dcgm is not None:
            self.dcgm.close()
        if self.simulated_node is not None:
            self.simulated_node.stop()

    def _without_nvml(self) -> None:
        """No GPU could be read this run. Kubernetes is still read, so that the kubelet service check tells
        what attribution lacks before the GPUs come back; in local mode the node around the GPUs and the
        kernel's log are still judged."""
        if self.pods is not None:
            state = self.pods.read_without_gpus()
            if state is not None:
                self._kubelet_check.send(*state)
        if not isinstance(self.source, LocalSource):
            return
        snapshot = self.source.read_without_nvml()
        self.judge.take_in(snapshot)
        self.submitter.submit_node(self.judge.node(snapshot, nvml_read=False))
        self.submitter.submit_events(snapshot, {})
        self._submitted()

    def _submitted(self) -> None:
        """The run's events and verdicts reached the Agent: the source moves past them, the judge keeps them."""
        self.source.submitted()
        self.judge.submitted()

    # --- reads, and the service checks that tell how they went -------------------------------------

    def _read_node(self) -> Optional[Snapshot]:
        if self.config.source == "sidecar" and self.config.ignore_missing_sidecar:
            if not os.path.exists(self.config.sidecar_socket):
                self.log.debug("no sidecar socket at %s on this node; nothing to do", self.config.sidecar_socket)
                return None
        try:
            snapshot = self.source.read()
        except SidecarUnavailable as e:
            self._sidecar_state(Status.CRITICAL, str(e))
            return None
        except NvmlError as e:
            # The library is missing, or NVML failed as a whole (not one GPU): nothing to read this run.
            self._sidecar_state(Status.OK, None)
            self._nvml_check.send(Status.CRITICAL, str(e))
            return None
        problem = getattr(self.source, "events_problem", None)
        if problem is None:
            self._sidecar_state(Status.OK, None)
        else:  # the sidecar answered; its events may still be unreadable, and wait in its journal
            self._sidecar_state(Status.WARNING, f"its events cannot be read and wait in its journal: {problem}")
        # NVML answers; what it cannot give (permission, events) is a WARNING.
        reason = "; ".join(snapshot.node.problems) or None
        self._nvml_check.send(Status.WARNING if reason else Status.OK, reason)
        return snapshot

    def _sidecar_state(self, status: Status, reason: Optional[str]) -> None:
        if self.config.source == "sidecar":
            self._sidecar_check.send(status, reason)

    def _read_pods(self, snapshot: Snapshot) -> Optional[List[PodInfo]]:
        """The kubelet's pods; None without Kubernetes or when they can't be read."""
        if self.pods is None:
            return None
        pods, state = self.pods.read(snapshot.allocations)
        self._kubelet_check.send(*state)
        return pods

    def _read_dcgm(self, snapshot: Snapshot, pods: Optional[List[PodInfo]]) -> None:
        """DCGM's activity into the snapshot; the service check only where an exporter is configured
        or was found. A sidecar given --dcgm-exporter-url has read it already, and its snapshot says
        how that went; otherwise the check reads it, in local and sidecar mode alike (finding the
        exporter takes the kubelet's pods, which only the check reads)."""
        if snapshot.dcgm_read is not None:
            self._dcgm_check.send(*state_of(snapshot.dcgm_read))
            return
        state = self.dcgm.enrich(snapshot, pods)
        if state is not None:
            self._dcgm_check.send(*state)

    def _report_versions(self, snapshot: Snapshot) -> None:
        for name in ("driver_version", "nvml_version", "cuda_driver_version"):
            value = getattr(snapshot.node, name)
            if value:
                self.set_metadata(name, value)

    # Each service check remembers the reason it last logged, from the run that first sends it.
    @cached_property
    def _nvml_check(self) -> ReasonedServiceCheck:
        return ReasonedServiceCheck(self, CAN_CONNECT, self.tags, "NVML answers, but: %s",
                                    "NVML is available again", critical="Cannot read GPUs: %s")

    @cached_property
    def _sidecar_check(self) -> ReasonedServiceCheck:
        return ReasonedServiceCheck(self, SIDECAR_CAN_CONNECT, self.tags, "Cannot read the sidecar: %s",
                                    "The sidecar answers again")

    @cached_property
    def _kubelet_check(self) -> ReasonedServiceCheck:
        return ReasonedServiceCheck(self, KUBELET_CAN_CONNECT, self.tags, "Kubernetes attribution degraded: %s",
                                    "kubelet and pod-resources answer again")

    @cached_property
    def _dcgm_check(self) -> ReasonedServiceCheck:
        return ReasonedServiceCheck(self, DCGM_CAN_CONNECT, self.tags,
                                    "DCGM activity is not read from dcgm-exporter: %s", "dcgm-exporter answers again")


def _orchestrator_tags(entity: str) -> List[str]:
    return tagger.tag(entity, tagger.ORCHESTRATOR) or []


def _simulated_node(scenario: str) -> "SimulatedNode":
    from gpu_monitoring.simulator.node import simulated_node
    from gpu_monitoring.simulator.scenario import ScenarioError

    try:
        return simulated_node(scenario)
    except ScenarioError as e:
        raise ConfigurationError(f"`simulate`: {e}") from e
