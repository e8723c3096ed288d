"""The gpu_monitoring Agent check: one run reads the node, attributes its GPUs, judges and submits."""

import os
import time
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

from datadog_checks.base import AgentCheck, ConfigurationError
from datadog_checks.base.utils.tagging import tagger

from gpu_monitoring.attribution.capacity import PriceOf
from gpu_monitoring.attribution.fleet import hourly_price
from gpu_monitoring.attribution.pipeline import Attribution, DeviceView, attribute
from gpu_monitoring.config.derived import Derived, derive
from gpu_monitoring.config_models import ConfigMixin
from gpu_monitoring.dcgm import DcgmReader
from gpu_monitoring.dcgm.outcome import state_of
from gpu_monitoring.deps import require
from gpu_monitoring.health import device_health as health
from gpu_monitoring.health import pcie_aer, zombie_memory
from gpu_monitoring.health.held_verdicts import HeldVerdicts
from gpu_monitoring.health.kernel_memory import KernelMemory
from gpu_monitoring.health.node_health import AER_SERIES, NodeJudge
from gpu_monitoring.health.pcie_aer import AerCounter, Counts
from gpu_monitoring.health.service_checks import ReasonedServiceCheck
from gpu_monitoring.health.xid_join import XidJoin
from gpu_monitoring.kube.allocations import AllocationReader
from gpu_monitoring.kube.kubelet import KubeletClient, KubeletError
from gpu_monitoring.kube.pod_list import PodInfo
from gpu_monitoring.net.agent_http import AgentHttp
from gpu_monitoring.node.boot import read_boot_id
from gpu_monitoring.node.driver_gpus import nvml_bus_id
from gpu_monitoring.node.hardware import HardwareReader
from gpu_monitoring.node.kernel_events import KernelEvents
from gpu_monitoring.node.kernel_log import Cursor, KernelLog
from gpu_monitoring.nvml.errors import NvmlError
from gpu_monitoring.sidecar.client import SidecarClient, SidecarUnavailable
from gpu_monitoring.snapshot import Allocations, Device, Node, Snapshot
from gpu_monitoring.sources import LocalSource, SidecarSource
from gpu_monitoring.status import Status
from gpu_monitoring.submission.fabric_identity import FabricIdentities
from gpu_monitoring.submission.node import NodeReport
from gpu_monitoring.submission.submitter import Submitter

# pynvml and grpcio (local mode) and the simulator are imported where they are used: the Agent
# ships neither package, and sidecar mode needs neither.
if TYPE_CHECKING:
    from gpu_monitoring.collectors.node_reader import NodeReader
    from gpu_monitoring.simulator.node import SimulatedNode

CAN_CONNECT = "nvml.can_connect"
KUBELET_CAN_CONNECT = "kubelet.can_connect"
SIDECAR_CAN_CONNECT = "sidecar.can_connect"
DCGM_CAN_CONNECT = "dcgm.can_connect"
CURSOR = "sidecar_event_cursor"
# The NVLink links seen up (health.NvLinkMemory), kept across Agent restarts: this check judges the
# snapshot in local and sidecar mode alike, so its cache serves both.
NVLINK_SEEN_UP = "nvlink_seen_up"
FABRIC_IDENTITIES = "fabric_identities"
# The verdicts held until their fix (held_verdicts), kept across Agent restarts the same way.
HELD_VERDICTS = "held_verdicts"
# Where local mode stopped reading the kernel's log (a sidecar keeps its own beside its journal); what the
# log told that outlives its line (kernel_memory); the XIDs counted and not yet paired (xid_join).
KERNEL_CURSOR = "kernel_log_cursor"
KERNEL_MEMORY = "kernel_memory"
XID_JOIN = "xid_join"


class GpuMonitoringCheck(AgentCheck, ConfigMixin):
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
        self.kubelet: Optional[KubeletClient] = None
        self.allocation_reader: Optional[AllocationReader] = None
        self.source: Optional[Union[LocalSource, SidecarSource]] = None
        self.dcgm: Optional[DcgmReader] = None
        self.price_of: Optional[PriceOf] = None
        self.node_judge: Optional[NodeJudge] = None
        self._held_written: Optional[str] = None
        self._previous: Dict[str, Device] = {}
        self._fabric_registered = health.FabricMemory()
        self._started = time.monotonic()  # the fabric registration grace counts from here
        self._told: set = set()

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
        the kubelet and pod-resources when its scenario has pods); an instance's own values still win."""
        if self.simulated_node is not None:
            standing_in = self.simulated_node.start(serve_kubernetes=self.derived.kubernetes != "false")
            self.derived = derive(self.config, standing_in)
        self.kubelet = KubeletClient(**self.derived.kubelet, http=AgentHttp) if self._on_kubernetes() else None
        self.source = self._source()
        self.dcgm = DcgmReader(self.config.dcgm_exporter_url)
        self.node_judge = NodeJudge(self.derived.sysfs_root, self.derived.expected_gpus,
                                    self.config.expected_network_ports, self.config.expected_network_rate,
                                    self.config.network_ports_exclude)
        self.price_of = partial(hourly_price, prices=self.derived.hourly_price,
                                default=self.config.default_hourly_price)

    def _source(self) -> Union[LocalSource, SidecarSource]:
        if self.config.source == "sidecar":
            client = SidecarClient(self.config.sidecar_socket)
            return SidecarSource(client, lambda: self.read_persistent_cache(CURSOR), self._save_cursor)
        if self.kubelet is not None:
            # Pods and their devices are kept as long as each other: one TTL, one view of the node.
            self.allocation_reader = AllocationReader(self.derived.pod_resources_socket,
                                                      self.config.gpu_resource_names, ttl=self.kubelet.ttl)
        save_cursor = partial(self.write_persistent_cache, KERNEL_CURSOR)
        return LocalSource(self._open_reader, self._kernel_events(), save_cursor)

    def _kernel_events(self) -> KernelEvents:
        """The kernel's log from where this check last stopped (in this boot)."""
        proc_root = self.derived.proc_root
        stored = Cursor.loads(self.read_persistent_cache(KERNEL_CURSOR))
        return KernelEvents(KernelLog(self.derived.kernel_log, proc_root, read_boot_id(proc_root), stored), proc_root)

    def _open_reader(self) -> "NodeReader":
        require("pynvml")  # a missing package is named, with the command that adds it
        from gpu_monitoring.collectors.node_reader import NodeReader
        from gpu_monitoring.nvml.session import NvmlSession

        return NodeReader(
            NvmlSession(self._library()),
            disabled=self.derived.disabled_collectors,
            proc_root=self.derived.proc_root,
            allocations=self.allocation_reader,
            # What the profile does not send is not read, where a read gives nothing else: health
            # and attribution judge only metrics of the smallest profile or reads that give them.
            profile=self.derived.profile,
            sysfs_root=self.derived.sysfs_root,
            clock=self._node_clock,
        )

    def _library(self) -> Any:
        """What NVML is loaded from: a simulated node's library, the instance's file, else the dynamic linker's."""
        from gpu_monitoring.nvml.library import LibraryPath

        if self.simulated_node is not None:
            return self.simulated_node.nvml.library
        path = self.config.nvml_library_path
        return LibraryPath(path, "nvml_library_path") if path else None

    def _save_cursor(self, value: str) -> None:
        self.write_persistent_cache(CURSOR, value)

    def _on_kubernetes(self) -> bool:
        if self.derived.kubernetes != "auto":
            return self.derived.kubernetes == "true"
        return os.path.exists(self.derived.pod_resources_socket) or "KUBERNETES_SERVICE_HOST" in os.environ

    def check(self, _instance) -> None:
        if self.source is None:
            self.start()
        snapshot = self._read_node()
        if snapshot is None:
            self._kubernetes_without_gpus()
            self._node_without_nvml()
            return
        self._report_versions(snapshot)
        self._held.booted(snapshot.node.boot_id)
        self._kernel_record(snapshot)
        pods = self._pods(snapshot.allocations)
        self._read_dcgm(snapshot, pods)
        attribution = attribute(snapshot, pods, self.config.effective_threshold, self.price_of,
                                self.derived.expected_gpus)
        aer = self._aer.count(snapshot.node, snapshot.events)
        if self._fabric_identities.fill(snapshot.devices):
            self.write_persistent_cache(FABRIC_IDENTITIES, self._fabric_identities.dumps())
        healths = {d.index: self._health(d, snapshot, attribution.devices[d.index], aer)
                   for d in snapshot.devices}
        self.submitter.submit(snapshot, healths, attribution, self._node(snapshot, aer=aer))
        self._submitted()
        self._save_held()
        self._report_problems(attribution)
        self._previous = {d.uuid: d for d in snapshot.devices if d.uuid and not d.lost}
        if self._nvlink_up.remember(snapshot.devices):
            self.write_persistent_cache(NVLINK_SEEN_UP, self._nvlink_up.dumps())
        self._fabric_registered.remember(snapshot.devices)

    def cancel(self) -> None:
        if self.source is not None:
            self.source.close()
        if self.dcgm is not None:
            self.dcgm.close()
        if self.simulated_node is not None:
            self.simulated_node.stop()

    # --- NVML -------------------------------------------------------------------------

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
        self._sidecar_state(*self._events_state())
        # NVML answers; what it cannot give (permission, events) is a WARNING.
        reason = "; ".join(snapshot.node.problems) or None
        self._nvml_check.send(Status.WARNING if reason else Status.OK, reason)
        return snapshot

    # Each service check remembers the reason it last logged, from the run that first sends it.
    @cached_property
    def _nvml_check(self) -> ReasonedServiceCheck:
        return ReasonedServiceCheck(self, CAN_CONNECT, self.tags, "NVML answers, but: %s",
                                    "NVML is available again", critical="Cannot read GPUs: %s")

    @cached_property
    def _sidecar_check(self) -> ReasonedServiceCheck:
        return ReasonedServiceCheck(self, SIDECAR_CAN_CONNECT, self.tags, "Cannot read the sidecar: %s",
                                    "The sidecar answers again")

    def _events_state(self) -> Tuple[Status, Optional[str]]:
        """The sidecar answered; its events may still be unreadable, and wait in its journal."""
        problem = getattr(self.source, "events_problem", None)
        if problem is None:
            return Status.OK, None
        return Status.WARNING, f"its events cannot be read and wait in its journal: {problem}"

    def _sidecar_state(self, status: Status, reason: Optional[str]) -> None:
        if self.config.source == "sidecar":
            self._sidecar_check.send(status, reason)

    def _report_versions(self, snapshot: Snapshot) -> None:
        for name in ("driver_version", "nvml_version", "cuda_driver_version"):
            value = getattr(snapshot.node, name)
            if value:
                self.set_metadata(name, value)

    # --- Kubernetes -------------------------------------------------------------------

    def _node_without_nvml(self) -> None:
        """In local mode, a run whose NVML cannot be read still judges the node from sysfs, the driver's
        record and the kernel's log: a driver that brought up none of the GPUs on the bus is the node's fault
        to tell, and the kernel's log may say why."""
        if self.config.source != "local":
            return
        node = Node()
        self._hardware.read_into(node)
        snapshot = Snapshot(timestamp=self._node_clock(), node=node, events=self.source.kernel_events(node))
        self._held.booted(node.boot_id)
        self._kernel_record(snapshot)
        aer = self._aer.count(node, snapshot.events)
        self.submitter.submit_node(self._node(snapshot, nvml_read=False, aer=aer))
        self.submitter.submit_events(snapshot, {})
        self._submitted()
        self._save_held()

    # --- the kernel's record ------------------------------------------------------------

    @cached_property
    def _kernel_memory(self) -> KernelMemory:
        return KernelMemory.loads(self.read_persistent_cache(KERNEL_MEMORY))

    @cached_property
    def _xids(self) -> XidJoin:
        return XidJoin.loads(self.read_persistent_cache(XID_JOIN))

    @cached_property
    def _aer(self) -> AerCounter:
        return AerCounter()

    def _kernel_record(self, snapshot: Snapshot) -> None:
        """What the kernel's log told, taken in before anything is judged: the GPUs it names, the driver's
        last load (which answers what was held before it), and each XID NVML told of too counted once."""
        memory = self._kernel_memory
        if memory.learn(snapshot.events, snapshot.node.boot_id):
            self.write_persistent_cache(KERNEL_MEMORY, memory.dumps())
        memory.name(snapshot.devices, snapshot.events)
        self._held.driver_loaded(memory.driver_loaded)
        snapshot.events = self._xids.join(snapshot.events, snapshot.timestamp)

    def _submitted(self) -> None:
        """The run's events reached the Agent: the source moves past them, and what the join counted is kept."""
        self.source.submitted()
        self._aer.commit()
        if self._xids.commit():
            self.write_persistent_cache(XID_JOIN, self._xids.dumps())

    @cached_property
    def _hardware(self) -> HardwareReader:
        return HardwareReader(self.derived.sysfs_root, self.derived.proc_root, self._node_clock)

    @property
    def _node_clock(self) -> Callable[[], float]:
        """The clock the node's counters, events and kernel log follow: a simulated node's own, the host's otherwise."""
        return self.simulated_node.wall_time if self.simulated_node is not None else time.time

    def _kubernetes_without_gpus(self) -> None:
        """No GPU could be read this run. In local mode pod-resources is still read, so that the
        kubelet service check tells what Kubernetes attribution lacks before the GPUs come back."""
        if self.kubelet is not None and self.allocation_reader is not None:
            self._pods(self.allocation_reader.read())

    @cached_property
    def _kubelet_check(self) -> ReasonedServiceCheck:
        return ReasonedServiceCheck(self, KUBELET_CAN_CONNECT, self.tags, "Kubernetes attribution degraded: %s",
                                    "kubelet and pod-resources answer again")

    def _pods(self, allocations: Allocations) -> Optional[List[PodInfo]]:
        """The kubelet's pods (None without Kubernetes or when it can't be read), with the
        kubelet service check saying how both kubelet sources fared."""
        if self.kubelet is None:
            return None
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
        self._kubelet_check.send(status, "; ".join(m for _, m in problems) or None)
        return pods

    def _report_problems(self, attribution: Attribution) -> None:
        # Each allocation that points at no GPU is told once, not every run.
        for problem in sorted(set(attribution.problems) - self._told):
            self.warning("pod-resources: %s", problem)
        self._told = set(attribution.problems)

    # --- DCGM ---------------------------------------------------------------------------

    @cached_property
    def _dcgm_check(self) -> ReasonedServiceCheck:
        return ReasonedServiceCheck(self, DCGM_CAN_CONNECT, self.tags,
                                    "DCGM activity is not read from dcgm-exporter: %s", "dcgm-exporter answers again")

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

    # --- health -----------------------------------------------------------------------

    @cached_property
    def _nvlink_up(self) -> health.NvLinkMemory:
        """Read at the first run: the Agent gives a check its ID (which keys the cache) after making it."""
        return health.NvLinkMemory.loads(self.read_persistent_cache(NVLINK_SEEN_UP))

    @cached_property
    def _fabric_identities(self) -> FabricIdentities:
        """Read at the first run, as the NVLink memory is."""
        return FabricIdentities.loads(self.read_persistent_cache(FABRIC_IDENTITIES))

    @cached_property
    def _held(self) -> HeldVerdicts:
        """Read at the first run, as the NVLink memory is."""
        return HeldVerdicts.loads(self.read_persistent_cache(HELD_VERDICTS), self.config.fault_hold)

    def _save_held(self) -> None:
        text = self._held.dumps()
        if text != self._held_written:
            self.write_persistent_cache(HELD_VERDICTS, text)
            self._held_written = text

    def _node(self, snapshot: Snapshot, nvml_read: bool = True,
              aer: Optional[Dict[str, Counts]] = None) -> NodeReport:
        """The node's verdict, with what is held of earlier ones; after the GPUs' (it counts their holds).
        A run whose NVML could not be read lists no GPU, and forgets none of theirs."""
        verdict = self.node_judge.judge(snapshot, nvml_read, self._kernel_memory.init_failures, aer)
        self._held.judge_node(verdict.health, snapshot.timestamp)
        if nvml_read:
            self._held.forget_others(d.uuid for d in snapshot.devices if d.uuid)
        return NodeReport(verdict, self.derived.expected_gpus, self._held.held_count, self._held.escalated_count)

    def _health(self, device: Device, snapshot: Snapshot, view: DeviceView,
                aer: Dict[str, Counts]) -> health.Health:
        """This run's verdict on the GPU, with what is held of earlier ones (held from the snapshot's time,
        or a kernel XID's own), the PCIe AER errors of its link, which its series carry too, and memory
        left held by processes whose owner is gone."""
        found = self._judge(device, snapshot, view.offered)
        zombie_memory.judge(found, view.zombies, view.shares.held)
        errors = aer.get(nvml_bus_id(device.pci_bus_id or "") or "")
        pcie_aer.judge(found, errors)
        device.metrics.update({AER_SERIES[severity]: count for severity, count in (errors or {}).items()})
        self._held.judge_gpu(device, found, snapshot.timestamp)
        return found

    def _judge(self, device: Device, snapshot: Snapshot, offered: Optional[bool]) -> health.Health:
        # By the GPU each event names, not by equal UUIDs: an event still finds a GPU the snapshot could
        # not name, and one that names no GPU is not given to every such GPU. A kernel line from before the
        # driver's last load is history that load answered.
        memory = self._kernel_memory
        events = [e for e in snapshot.events if snapshot.device_of(e) is device and not memory.superseded(e)]
        return health.evaluate(
            device,
            self._previous.get(device.uuid),
            events,
            xid_ignore=self.config.xid_ignore,
            temperature_margin=self.config.temperature_margin,
            offered=offered,
            nvlink_seen_up=self._nvlink_up.seen_up(device.uuid),
            fabric_registered_before=self._fabric_registered.registered_before(device.uuid),
            fabric_grace_over=time.monotonic() - self._started >= self.config.fabric_registration_grace,
        )


def _orchestrator_tags(entity: str) -> List[str]:
    return tagger.tag(entity, tagger.ORCHESTRATOR) or []


def _simulated_node(scenario: str) -> "SimulatedNode":
    from gpu_monitoring.simulator import ScenarioError
    from gpu_monitoring.simulator.node import simulated_node

    try:
        return simulated_node(scenario)
    except ScenarioError as e:
        raise ConfigurationError(f"`simulate`: {e}") from e
