"""Snapshot and attribution to Datadog: metrics by the spec's types, health, XIDs, workloads, fleet, cost.

This layer never calls NVML; it reads the Snapshot and what attribution and health made of it.
"""

from typing import AbstractSet, Callable, Dict, List, Union

from datadog_checks.base import AgentCheck

from gpu_monitoring.attribution import Attribution, Tagger
from gpu_monitoring.health.device_health import Health
from gpu_monitoring.metrics.spec import DEFAULT_PROFILE, SPEC, sent_in
from gpu_monitoring.snapshot import Device, MigInstance, Process, Snapshot
from gpu_monitoring.submission.events import submit_xids
from gpu_monitoring.submission.inventory import submit_inventory
from gpu_monitoring.submission.node import NodeReport, submit_node
from gpu_monitoring.submission.tags import (
    HolderTags,
    claim_tags,
    device_name,
    device_tags,
    merge,
    mig_tags,
    process_tags,
)

__all__ = ["NodeReport", "Submitter"]

HEALTH_CHECK = "device.health"
PROCESS_METRICS = {
    "process.memory.used": "used_memory",
    "process.sm_utilization": "sm_utilization",
    "process.memory_utilization": "memory_utilization",
    "process.encoder_utilization": "encoder_utilization",
    "process.decoder_utilization": "decoder_utilization",
}


class Submitter:
    _holder_tags: HolderTags  # the run's own: see submit

    def __init__(self, check: AgentCheck, base_tags: List[str], tagger: Tagger, max_processes: int = 0,
                 profile: str = DEFAULT_PROFILE):
        self.check = check
        self.base_tags = list(base_tags)
        self.tagger = tagger
        self.max_processes = max_processes
        # The check's submit method, by the spec's type, for each metric the profile sends: the one
        # place a profile acts. Collection, health, service checks and events never depend on it.
        sent = sent_in(profile)
        self._submitters = _submitters(check, sent)
        # A part's series (one NVLink link's) may belong to a larger profile than the GPU's own.
        self._part_submitters = _submitters(check, sent_in(profile, parts=True))
        self._process_metrics = {name: field for name, field in PROCESS_METRICS.items() if name in sent}

    def submit(self, snapshot: Snapshot, healths: Dict[int, Health], attribution: Attribution,
               node: NodeReport) -> None:
        # Asked anew each run: what the tagger knows of a container can change from one to the next.
        self._holder_tags = HolderTags(self.tagger)
        self.send("devices.count", len(snapshot.devices), self.base_tags)
        self.submit_node(node)
        own_tags, held_tags = {}, {}
        for device in snapshot.devices:
            own, held = self._device(device, snapshot, healths[device.index], attribution)
            own_tags.update(own)
            held_tags.update(held)
        self._workloads(attribution, own_tags)
        self._fleet(attribution)
        # A GPU's own tags, not its holder's: pods coming and going make no new inventory series.
        submit_inventory(self.send, snapshot, self.base_tags,
                         {device.index: own_tags[(device.index, None)] for device in snapshot.devices})
        by_uuid = {d.uuid: held_tags[(d.index, None)] for d in snapshot.devices}
        submit_xids(self.check, snapshot, by_uuid, self.base_tags)

    def submit_node(self, node: NodeReport) -> None:
        """The node's own series and health: with the GPUs' each run, or alone where NVML cannot be read."""
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
        self._send_values(target.metrics, tags, self._submitters)
        for part, values in target.tagged_metrics.items():
            self._send_values(values, tags + part.split(","), self._part_submitters)

    @staticmethod
    def _send_values(values: Dict[str, float], tags: List[str], submitters: Dict[str, Callable]) -> None:
        # A name no collector declares (a newer sidecar's) has no submitter, as one the profile leaves out.
        for name, value in values.items():
            submit = submitters.get(name)
            if submit is not None:
                submit(name, value, tags=tags)

    def send(self, name: str, value: float, tags: List[str]) -> None:
        """One series, if the profile sends its metric."""
        submit = self._submitters.get(name)
        if submit is not None:
            submit(name, value, tags=tags)

    def _processes(self, processes: List[Process], tags: List[str], held: List[str], key, attribution) -> None:
        """Per-process series for the processes using the most memory, up to max_processes (0: all).
        Each carries the target's own tags and its own owner's; the count left out is the target's."""
        if not self._process_metrics:
            return
        kept = sorted(processes, key=lambda p: p.used_memory or 0, reverse=True)
        if self.max_processes:
            kept = kept[: self.max_processes]
            self.send("processes.omitted", len(processes) - len(kept), held)
        gauge, holders = self.check.gauge, attribution.process_holders
        for process in kept:
            holder = holders.get((key, process.pid))
            process_series = process_tags(process, tags, self._holder_tags(holder) if holder else ())
            for name, field in self._process_metrics.items():
                value = getattr(process, field)
                if value is not None:
                    gauge(name, value, tags=process_series)

    def _cost(self, view, tags: List[str]) -> None:
        if view.price is None:
            return
        self.send("cost.hourly", view.price, tags)
        self.send("cost.idle_hourly", 0.0 if view.state.active else view.price, tags)

    def _workloads(self, attribution: Attribution, target_tags: dict) -> None:
        for workload in attribution.workloads:
            tags = merge(target_tags.get(workload.target, self.base_tags), self._holder_tags(workload.holder),
                         claim_tags(workload.dra_claims))
            values = {
                "workload.gpus": workload.gpus,
                "workload.memory.used": workload.memory_used,
                "workload.sm_utilization": workload.sm_utilization,
                "workload.sm_limit": workload.sm_limit,
                "workload.idle": int(workload.idle),
            }
            price = attribution.devices[workload.target[0]].price
            if price is not None:
                values["workload.cost.hourly"] = price * workload.gpus
                values["workload.cost.idle_hourly"] = price * workload.gpus if workload.idle else 0.0
            for name, value in values.items():
                if value is not None:
                    self.send(name, value, tags)

    def _fleet(self, attribution: Attribution) -> None:
        for (model, basis), counts in attribution.funnel.items():
            # activity_source: what `effective` was judged by; a sum over it gives the model's counts.
            model_tags = [f"gpu_device:{device_name(model)}"] if model else []
            tags = merge(self.base_tags, model_tags, [f"activity_source:{basis}"])
            for stage, count in counts.items():
                self.send(f"fleet.devices.{stage}", count, tags)


def _submitters(check: AgentCheck, names: AbstractSet[str]) -> Dict[str, Callable]:
    """The check's submit method, by the spec's type, for each of these metrics."""
    return {name: check.monotonic_count if SPEC[name].type == "monotonic_count" else check.gauge for name in names}
