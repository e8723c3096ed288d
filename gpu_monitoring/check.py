"""The gpu_monitoring Agent check: one run reads the node, judges each GPU, and submits."""

from typing import Dict, Optional

from datadog_checks.base import AgentCheck, ConfigurationError

from . import health, simulator
from .collectors import NodeCollector
from .config import parse
from .nvml import NvmlError, NvmlSession
from .snapshot import Device, Snapshot
from .submission import Submitter

CAN_CONNECT = "nvml.can_connect"


class GpuMonitoringCheck(AgentCheck):
    __NAMESPACE__ = "gpu_monitoring"

    def __init__(self, name, init_config, instances):
        super().__init__(name, init_config, instances)
        self.config = parse(self.instance or {})
        self.simulation: Optional[simulator.SimulatedNvml] = None
        library = self.config.nvml_library_path
        if self.config.simulate:
            self.simulation = simulator.SimulatedNvml(_scenario(self.config.simulate))
            library = self.simulation.library
        self.collector = NodeCollector(NvmlSession(library), disabled=self.config.disabled_collectors)
        self.submitter = Submitter(self, self.config.tags)
        self._previous: Dict[str, Device] = {}
        self._unavailable: Optional[str] = None

    def check(self, _instance) -> None:
        snapshot = self._read_node()
        if snapshot is None:
            return
        self._report_versions(snapshot)
        healths = {device.index: self._health(device, snapshot) for device in snapshot.devices}
        self.submitter.submit(snapshot, healths)
        self._previous = {d.uuid: d for d in snapshot.devices if d.uuid and not d.lost}

    def cancel(self) -> None:
        self.collector.close()

    def _read_node(self) -> Optional[Snapshot]:
        try:
            snapshot = self.collector.collect()
        except NvmlError as e:
            # The library is missing, or NVML failed as a whole (not one GPU): nothing to read this run.
            self._nvml_unavailable(str(e))
            return None
        if self._unavailable:
            self.log.info("NVML is available again")
            self._unavailable = None
        self.service_check(CAN_CONNECT, AgentCheck.OK, tags=self.config.tags)
        return snapshot

    def _nvml_unavailable(self, reason: str) -> None:
        # One log line when NVML goes away or the reason changes, not one per run.
        if reason != self._unavailable:
            self.log.warning("Cannot read GPUs: %s", reason)
            self._unavailable = reason
        self.service_check(CAN_CONNECT, AgentCheck.CRITICAL, tags=self.config.tags, message=reason)

    def _health(self, device: Device, snapshot: Snapshot) -> health.Health:
        events = [e for e in snapshot.events if e.device_uuid == device.uuid]
        return health.evaluate(
            device,
            self._previous.get(device.uuid),
            events,
            xid_ignore=self.config.xid_ignore,
            temperature_margin=self.config.temperature_margin,
        )

    def _report_versions(self, snapshot: Snapshot) -> None:
        for name in ("driver_version", "nvml_version", "cuda_driver_version"):
            value = getattr(snapshot.node, name)
            if value:
                self.set_metadata(name, value)


def _scenario(name_or_path: str) -> simulator.Scenario:
    try:
        return simulator.load(name_or_path)
    except simulator.ScenarioError as e:
        raise ConfigurationError(f"`simulate`: {e}") from e
