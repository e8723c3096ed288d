"""The run's submission: a GPU's, its MIG instances' and processes' series, workloads, fleet and cost, in order.

This layer never calls NVML; it reads the Snapshot and what attribution and health made of it.
"""

import logging
from typing import Dict, List, Optional, Set, Union

from datadog_checks.base import AgentCheck

from gpu_monitoring.attribution.fleet import STAGES
from gpu_monitoring.attribution.holders import Holder, Tagger
from gpu_monitoring.attribution.pipeline import Attribution
from gpu_monitoring.attribution.workloads import Workload
from gpu_monitoring.health.device_health import Health
from gpu_monitoring.health.judge import NodeReport
from gpu_monitoring.metrics.names import (
    COST_HOURLY,
    COST_IDLE_HOURLY,
    DEVICES_COUNT,
    FLEET_CAPACITY_UNALLOCATED,
    FLEET_COST_UNALLOCATED_HOURLY,
    FLEET_COST_UNUSABLE_HOURLY,
    FLEET_DEVICES_UNUSABLE,
    PROCESS_DECODER_UTILIZATION,
    PROCESS_ENCODER_UTILIZATION,
    PROCESS_MEMORY_USED,
    PROCESS_MEMORY_UTILIZATION,
    PROCESS_SM_UTILIZATION,
    PROCESSES_OMITTED,
    PROCESSES_ZOMBIE,
    PROCESSES_ZOMBIE_MEMORY,
    WORKLOAD_COST_HOURLY,
    WORKLOAD_COST_IDLE_HOURLY,
    WORKLOAD_CPU_THROTTLED,
    WORKLOAD_CPU_USAGE,
    WORKLOAD_GPUS,
    WORKLOAD_IDLE,
    WORKLOAD_MEMORY_USED,
    WORKLOAD_SM_LIMIT,
    WORKLOAD_SM_UTILIZATION,
)
from gpu_monitoring.metrics.profile import DEFAULT, Profile
from gpu_monitoring.metrics.spec import SPEC
from gpu_monitoring.snapshot import Device, MigInstance, Process, Snapshot
from gpu_monitoring.submission.events import submit_xids
from gpu_monitoring.submission.inventory import submit_inventory
from gpu_monitoring.submission.metric_sink import MetricSink, Route
from gpu_monitoring.submission.node import submit_node
from gpu_monitoring.submission.tags import (
    HolderTags,
    claim_tags,
    device_name,
    device_tags,
    merge,
    mig_tags,
    process_tags,
)

log = logging.getLogger(__name__)

HEALTH_CHECK = "device.health"
PROCESS_METRICS = {
    PROCESS_MEMORY_USED: "used_memory",
    PROCESS_SM_UTILIZATION: "sm_utilization",
    PROCESS_MEMORY_UTILIZATION: "memory_utilization",
    PROCESS_ENCODER_UTILIZATION: "encoder_utilization",
    PROCESS_DECODER_UTILIZATION: "decoder_utilization",
}


class UnknownMetric(ValueError):
    """This code sent a metric metrics.yaml does not name: a defect, which fails the run that sends it."""


class Submitter:
    """Names reach it two ways, told apart on purpose:
    - from this code (`send`): constants of metrics.names, so a misspelt one fails where its module
      is imported; one that is not in the spec all the same raises UnknownMetric;
    - from the snapshot's metrics, which a sidecar sends as JSON: a newer sidecar may know metrics
      this check does not, the one legitimate unknown name. Its series are dropped, each name logged
      once at debug level.
    """

    _holder_tags: HolderTags  # the run's own: see submit

    def __init__(self, check: AgentCheck, base_tags: List[str], tagger: Tagger, max_processes: int = 0,
                 profile: Profile = DEFAULT):
        self.check = check
        self.base_tags = list(base_tags)
        self.tagger = tagger
        self.max_processes = max_processes
        self.profile = profile
        # The check's submit method, by the spec's type, for each metric the profile sends. Collection
        # asks the same profile what not to read; health, service checks and events never depend on it.
        self._sink = MetricSink(check)
        self._routes = self._sink.routes(profile.sent)
        self._part_routes = self._sink.routes(profile.sent_parts)
        self._process_metrics = [(self._routes[name], field) for name, field in PROCESS_METRICS.items()
                                 if name in self._routes]
        self._unknown_told: Set[str] = set()

    def submit(self, snapshot: Snapshot, healths: Dict[int, Health], attribution: Attribution,
               node: NodeReport) -> None:
        # Asked anew each run: what the tagger knows of a container can change from one to the next.
        self._holder_tags = HolderTags(self.tagger)
        self._sink.open()
        self.send(DEVICES_COUNT, len(snapshot.devices), self.base_tags)
        submit_node(self.check, self.send, node, self.base_tags)
        own_tags, held_tags = {}, {}
        for device in snapshot.devices:
            own, held = self._device(device, snapshot, healths[device.index], attribution)
            own_tags.update(own)
            held_tags.update(held)
        self._workloads(attribution, own_tags)
        self._fleet(attribution)
        self._capacity(snapshot, attribution)
        # A GPU's own tags, not its holder's: pods coming and going make no new inventory series.
        submit_inventory(self.send, snapshot, self.base_tags,
                         {device.index: own_tags[(device.index, None)] for device in snapshot.devices})
        self.submit_events(snapshot, {d.uuid: held_tags[(d.index, None)] for d in snapshot.devices},
                           attribution.event_holders)

    def submit_events(self, snapshot: Snapshot, tags_by_uuid: Dict[str, List[str]],
                      holders: Optional[Dict[int, Holder]] = None) -> None:
        """The run's XIDs: with the GPUs' series, or alone where NVML cannot be read (the kernel's log tells)."""
        # Owners come from the run's attribution, and so does the tagger's view of them (`submit`).
        submit_xids(self.check, snapshot, tags_by_uuid, self.base_tags, holders,
                    self._holder_tags if holders else lambda _: [])

    def submit_node(self, node: NodeReport) -> None:
        """The node's own series and health: with the GPUs' each run, or alone where NVML cannot be read."""
        self._sink.open()
        submit_node(self.check, self.send, node, self.base_tags)

    def _device(self, device: Device, snapshot: Snapshot, health: Health, attribution: Attribution) -> tuple:
        """Submits a GPU's and its MIG instances' series. Returns their own tags, which workload and
        process series start from (each adds its own owner's), and the tags with an exclusive
        holder's, which the GPU's own series and XIDs carry."""
        view = attribution.devices[device.index]
        own = merge(self.base_tags, device_tags(device, snapshot, view))
        tags = self._held(own, view.holders.get((device.index, None)))
        self._target_metrics(device, tags)
        self._cost(view, tags)
        if view.zombies:  # rare: a series only while there are any, none for every healthy GPU
            self.send(PROCESSES_ZOMBIE, len(view.zombies), tags)
            self.send(PROCESSES_ZOMBIE_MEMORY, sum(zombie.memory for zombie in view.zombies), tags)
        self.check.service_check(HEALTH_CHECK, health.status, tags=tags, message=health.message or None)
        owns, helds = {(device.index, None): own}, {(device.index, None): tags}
        if not device.mig_instances:
            self._processes(device.processes, own, tags, (device.index, None), attribution)
        for instance in device.mig_instances:
            key = (device.index, instance.uuid)
            instance_own = mig_tags(instance, device, own, view)
            instance_tags = self._held(instance_own, view.holders.get(key))
            self._target_metrics(instance, instance_tags)
            self._processes(instance.processes, instance_own, instance_tags, key, attribution)
            owns[key], helds[key] = instance_own, instance_tags
        return owns, helds

    def _held(self, tags: List[str], holder) -> List[str]:
        """A GPU or MIG instance held by one container, unshared, carries that container's tags."""
        return merge(tags, self._holder_tags(holder)) if holder else tags

    def _target_metrics(self, target: Union[Device, MigInstance], tags: List[str]) -> None:
        """A GPU's or MIG instance's own series, then those of its parts, each part under its own tags too."""
        self._send_values(target.metrics, tags, self._routes)
        for part, values in target.tagged_metrics.items():
            self._send_values(values, tags + part.split(","), self._part_routes)

    def _send_values(self, values: Dict[str, float], tags: List[str], routes: Dict[str, Route]) -> None:
        """A snapshot's series, where the profile sends their metrics."""
        series = []
        for name, value in values.items():
            route = routes.get(name)
            if route is not None:
                series.append((route, value))
            elif name not in SPEC:
                self._unknown_from_snapshot(name)
        self._sink.submit_all(series, tags)

    def _unknown_from_snapshot(self, name: str) -> None:
        if name not in self._unknown_told:
            self._unknown_told.add(name)
            log.debug("the snapshot has metric %r, which this check does not know (a newer sidecar's): not sent", name)

    def send(self, name: str, value: float, tags: List[str]) -> None:
        """One series of a metric this code names, if the profile sends it; UnknownMetric for a name the
        spec does not have."""
        route = self._routes.get(name)
        if route is not None:
            self._sink.submit(route, value, tags)
        elif name not in SPEC:
            raise UnknownMetric(f"{name!r} is not in metrics.yaml: name metrics by metrics.names' constants")

    def _processes(self, processes: List[Process], tags: List[str], held: List[str], key, attribution) -> None:
        """Per-process series for the processes using the most memory, up to max_processes (0: all).
        Each carries the target's own tags and its own owner's; the count left out is the target's."""
        if not self._process_metrics:
            return
        kept = sorted(processes, key=lambda p: p.used_memory or 0, reverse=True)
        if self.max_processes:
            kept = kept[: self.max_processes]
            self.send(PROCESSES_OMITTED, len(processes) - len(kept), held)
        holders = attribution.process_holders
        for process in kept:
            holder = holders.get((key, process.pid))
            process_series = process_tags(process, tags, self._holder_tags(holder) if holder else ())
            self._sink.submit_all([(route, getattr(process, field)) for route, field in self._process_metrics],
                                  process_series)

    def _cost(self, view, tags: List[str]) -> None:
        if view.price is None:
            return
        self.send(COST_HOURLY, view.price, tags)
        self.send(COST_IDLE_HOURLY, view.price * view.shares.idle, tags)

    def _workloads(self, attribution: Attribution, target_tags: dict) -> None:
        for workload in attribution.workloads:
            tags = merge(target_tags.get(workload.target, self.base_tags), self._holder_tags(workload.holder),
                         claim_tags(workload.dra_claims))
            # Why it idles, on the series that say it does and what that costs: idle cost by reason.
            idle_tags = tags + [f"idle_reason:{workload.idle_reason}"] if workload.idle_reason else tags
            price = attribution.devices[workload.target[0]].price
            for name, value, series_tags in _workload_values(workload, price, tags, idle_tags):
                if value is not None:
                    self.send(name, value, series_tags)

    def _fleet(self, attribution: Attribution) -> None:
        for (model, basis), counts in attribution.funnel.items():
            # activity_source: what `effective` was judged by; a sum over it gives the model's counts.
            model_tags = [f"gpu_device:{device_name(model)}"] if model else []
            tags = merge(self.base_tags, model_tags, [f"activity_source:{basis}"])
            for stage, count in counts.items():
                self.send(STAGES[stage], count, tags)

    def _capacity(self, snapshot: Snapshot, attribution: Attribution) -> None:
        """By model: the capacity no workload holds (zeros too: a node using all it has shows so), and the GPUs
        the node cannot use, only where it has any; each with its price where the model has one."""
        models = {device.name for device in snapshot.devices} | {gpu.model for gpu in attribution.unusable}
        for model in models:
            tags = merge(self.base_tags, [f"gpu_device:{device_name(model)}"] if model else [])
            views = [attribution.devices[d.index] for d in snapshot.devices if d.name == model]
            unusable = [gpu for gpu in attribution.unusable if gpu.model == model]
            unallocated = sum(view.shares.unallocated for view in views)
            price = next((p for p in [v.price for v in views] + [g.price for g in unusable] if p is not None), None)
            if views:
                self.send(FLEET_CAPACITY_UNALLOCATED, unallocated, tags)
                if price is not None:
                    self.send(FLEET_COST_UNALLOCATED_HOURLY, price * unallocated, tags)
            if unusable:
                self.send(FLEET_DEVICES_UNUSABLE, len(unusable), tags)
                if price is not None:
                    self.send(FLEET_COST_UNUSABLE_HOURLY, price * len(unusable), tags)


def _workload_values(workload: Workload, price: Optional[float], tags: List[str], idle_tags: List[str]) -> List[tuple]:
    """(metric, value, tags) of a workload's series; a value None is not sent."""
    cpu = workload.cpu
    idle_cost = None if price is None else (price * workload.gpus if workload.idle else 0.0)
    return [
        (WORKLOAD_GPUS, workload.gpus, tags),
        (WORKLOAD_MEMORY_USED, workload.memory_used, tags),
        (WORKLOAD_SM_UTILIZATION, workload.sm_utilization, tags),
        (WORKLOAD_SM_LIMIT, workload.sm_limit, tags),
        (WORKLOAD_IDLE, int(workload.idle), idle_tags),
        (WORKLOAD_COST_HOURLY, None if price is None else price * workload.gpus, tags),
        (WORKLOAD_COST_IDLE_HOURLY, idle_cost, idle_tags),
        # Throttling is counted only in periods a quota enforces: none without one.
        (WORKLOAD_CPU_THROTTLED, cpu.throttled if cpu and cpu.quota_cores else None, tags),
        (WORKLOAD_CPU_USAGE, cpu.usage_cores if cpu else None, tags),
    ]

