"""The run's verdicts, with what earlier runs leave to judge by: the GPUs' and the node's health.

What outlives a run is kept in the Agent's persistent cache, so that an Agent restart forgets none of
it: the NVLink links seen up, the GPUs' fabric identities, the verdicts held until their fix, what the
kernel's log told that outlives its line, and the XIDs counted and not yet paired. The check judges the
snapshot in local and sidecar mode alike, so this memory serves both.
"""

import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

from gpu_monitoring.attribution.pipeline import Attribution, DeviceView
from gpu_monitoring.health import device_health, pcie_aer, zombie_memory
from gpu_monitoring.health.fabric_identity import FabricIdentities
from gpu_monitoring.health.held_verdicts import HeldVerdicts
from gpu_monitoring.health.kernel_memory import KernelMemory
from gpu_monitoring.health.node_health import AER_SERIES, NodeJudge, NodeVerdict
from gpu_monitoring.health.pcie_aer import AerCounter, Counts
from gpu_monitoring.health.xid_join import XidJoin
from gpu_monitoring.node.driver_gpus import nvml_bus_id
from gpu_monitoring.snapshot import Device, Snapshot

# The persistent cache's keys.
NVLINK_SEEN_UP = "nvlink_seen_up"
FABRIC_IDENTITIES = "fabric_identities"
HELD_VERDICTS = "held_verdicts"
KERNEL_MEMORY = "kernel_memory"
XID_JOIN = "xid_join"


@dataclass
class NodeReport:
    verdict: NodeVerdict
    expected_gpus: Optional[int]
    held: int  # verdicts held on the node, its GPUs' and its own
    escalated: int  # GPUs that needed a reset too often


@dataclass(frozen=True)
class Rules:
    """The instance's options the verdicts follow."""

    xid_ignore: tuple
    temperature_margin: float
    fault_hold: float
    fabric_registration_grace: float
    expected_gpus: Optional[int]


class Judge:
    """Made on the check's first run: the Agent gives a check its ID, which keys the cache, after making it."""

    def __init__(self, rules: Rules, node_judge: NodeJudge, read: Callable[[str], Optional[str]],
                 write: Callable[[str, str], None]):
        self._rules = rules
        self.node_judge = node_judge
        self._write = write
        self._nvlink_up = device_health.NvLinkMemory.loads(read(NVLINK_SEEN_UP))
        self._identities = FabricIdentities.loads(read(FABRIC_IDENTITIES))
        self._held = HeldVerdicts.loads(read(HELD_VERDICTS), rules.fault_hold)
        self._held_written: Optional[str] = None
        self._kernel = KernelMemory.loads(read(KERNEL_MEMORY))
        self._xids = XidJoin.loads(read(XID_JOIN))
        self._aer = AerCounter()
        self._aer_found: Dict[str, Counts] = {}
        self._registered = device_health.FabricMemory()
        self._started = time.monotonic()  # the fabric registration grace counts from here
        self._previous: Dict[str, Device] = {}

    def take_in(self, snapshot: Snapshot) -> None:
        """What the kernel's log told, taken in before anything is judged: the boot, the GPUs it names, the
        driver's last load (which answers what was held before it), each XID NVML told of too counted once,
        and the PCIe AER errors the run found."""
        self._held.booted(snapshot.node.boot_id)
        if self._kernel.learn(snapshot.events, snapshot.node.boot_id):
            self._write(KERNEL_MEMORY, self._kernel.dumps())
        self._kernel.name(snapshot.devices, snapshot.events)
        self._held.driver_loaded(self._kernel.driver_loaded)
        snapshot.events = self._xids.join(snapshot.events, snapshot.timestamp)
        self._aer_found = self._aer.count(snapshot.node, snapshot.events)

    def gpus(self, snapshot: Snapshot, attribution: Attribution) -> Dict[int, device_health.Health]:
        """Each GPU's verdict; a GPU out of its fabric keeps the identity it was last seen with."""
        if self._identities.fill(snapshot.devices):
            self._write(FABRIC_IDENTITIES, self._identities.dumps())
        return {d.index: self._gpu(d, snapshot, attribution.devices[d.index]) for d in snapshot.devices}

    def node(self, snapshot: Snapshot, nvml_read: bool = True) -> NodeReport:
        """The node's verdict, with what is held of earlier ones; after the GPUs' (it counts their holds).
        A run whose NVML could not be read lists no GPU, and forgets none of theirs."""
        verdict = self.node_judge.judge(snapshot, nvml_read, self._kernel.init_failures, self._aer_found)
        self._held.judge_node(verdict.health, snapshot.timestamp)
        if nvml_read:
            self._held.forget_others(d.uuid for d in snapshot.devices if d.uuid)
        return NodeReport(verdict, self._rules.expected_gpus, self._held.held_count, self._held.escalated_count)

    def submitted(self) -> None:
        """The run's verdicts reached the Agent: what the AER count and the XID join counted is kept, and the
        held verdicts where they changed."""
        self._aer.commit()
        if self._xids.commit():
            self._write(XID_JOIN, self._xids.dumps())
        held = self._held.dumps()
        if held != self._held_written:
            self._write(HELD_VERDICTS, held)
            self._held_written = held

    def remember(self, snapshot: Snapshot) -> None:
        """What the next run judges against: these GPUs as they were, their links seen up, their fabric."""
        self._previous = {d.uuid: d for d in snapshot.devices if d.uuid and not d.lost}
        if self._nvlink_up.remember(snapshot.devices):
            self._write(NVLINK_SEEN_UP, self._nvlink_up.dumps())
        self._registered.remember(snapshot.devices)

    def _gpu(self, device: Device, snapshot: Snapshot, view: DeviceView) -> device_health.Health:
        """This run's verdict on the GPU, with what is held of earlier ones (held from the snapshot's time,
        or a kernel XID's own), the PCIe AER errors of its link, which its series carry too, and memory
        left held by processes whose owner is gone."""
        found = self._evaluate(device, snapshot, view.offered)
        zombie_memory.judge(found, view.zombies, view.shares.held)
        errors = self._aer_found.get(nvml_bus_id(device.pci_bus_id or "") or "")
        pcie_aer.judge(found, errors)
        device.metrics.update({AER_SERIES[severity]: count for severity, count in (errors or {}).items()})
        self._held.judge_gpu(device, found, snapshot.timestamp)
        return found

    def _evaluate(self, device: Device, snapshot: Snapshot, offered: Optional[bool]) -> device_health.Health:
        # By the GPU each event names, not by equal UUIDs: an event still finds a GPU the snapshot could
        # not name, and one that names no GPU is not given to every such GPU. A kernel line from before the
        # driver's last load is history that load answered.
        events = [e for e in snapshot.events if snapshot.device_of(e) is device and not self._kernel.superseded(e)]
        rules = self._rules
        return device_health.evaluate(
            device,
            self._previous.get(device.uuid),
            events,
            xid_ignore=rules.xid_ignore,
            temperature_margin=rules.temperature_margin,
            offered=offered,
            nvlink_seen_up=self._nvlink_up.seen_up(device.uuid),
            fabric_registered_before=self._registered.registered_before(device.uuid),
            fabric_grace_over=time.monotonic() - self._started >= rules.fabric_registration_grace,
        )
