"""The attribution pass: `attribute()` runs each stage once, and gives what the check judges and sends.

It reads a Snapshot (NVML, processes with their cgroup owners, pod-resources allocations)
and the kubelet's pods, and never calls NVML or submits anything. One pass, each stage once:
targets (what can be held) → claims (who was given each, through device plugins or DRA) →
owners (who runs each process, and whose process each XID hit) → workloads (each holder's share and
use) → idle reasons (why a held GPU sits idle) → fleet (funnel, cost).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from gpu_monitoring.attribution.capacity import GpuShares, PriceOf, Unusable
from gpu_monitoring.attribution.claims import Claimed, claims
from gpu_monitoring.attribution.fleet import DeviceState, Fleet, FunnelKey, fleet
from gpu_monitoring.attribution.holders import Holder, PodDirectory
from gpu_monitoring.attribution.idle_reasons import Zombie, explain, zombies
from gpu_monitoring.attribution.owners import event_owners, owners
from gpu_monitoring.attribution.targets import TargetKey, targets
from gpu_monitoring.attribution.workloads import Workload, Workloads, workloads
from gpu_monitoring.kube.pod_list import PodInfo
from gpu_monitoring.snapshot import Device, Snapshot


@dataclass
class DeviceView:
    slicing_mode: str  # none | mig-parent
    state: DeviceState
    price: Optional[float]
    holders: Dict[TargetKey, Holder] = field(default_factory=dict)  # exclusive holder of a GPU or MIG instance
    sharing: Dict[TargetKey, str] = field(default_factory=dict)  # none | time_slicing | mps per target
    offered: Optional[bool] = None  # does a device plugin advertise it; None when the kubelet did not say
    shares: GpuShares = field(default_factory=GpuShares)  # what its workloads hold of it, idle or not
    zombies: List[Zombie] = field(default_factory=list)  # processes holding its memory after their owner is gone

    def sharing_mode(self, key: TargetKey) -> str:
        """A MIG parent is no target of its own: nothing shares it."""
        return self.sharing.get(key, "none")


@dataclass
class Attribution:
    devices: Dict[int, DeviceView]
    workloads: List[Workload]
    process_holders: Dict[Tuple[TargetKey, int], Holder]
    funnel: Dict[FunnelKey, Dict[str, int]]  # counts by (GPU model, activity basis)
    allocations_from: str  # pod_resources | processes
    problems: List[str]
    # The owner of the process each XID hit, by the event's position in the snapshot's events.
    event_holders: Dict[int, Holder] = field(default_factory=dict)
    unusable: List[Unusable] = field(default_factory=list)  # GPUs the node has and cannot use


def attribute(
    snapshot: Snapshot, pods: Optional[List[PodInfo]], effective_threshold: float, price_of: PriceOf,
    expected_gpus: Optional[int] = None,
) -> Attribution:
    """`effective_threshold` is the SM activity (%) from which an active GPU counts as effective; `price_of`
    a GPU model's price per hour (hourly_price with the configured prices); `expected_gpus` the GPUs the
    node should have, where configured."""
    directory = PodDirectory(pods)
    held = targets(snapshot)
    claimed = claims(snapshot, held, directory)
    owned = owners(held, directory)
    found = workloads(held, claimed, owned)
    stale = zombies(held, owned)
    explain(found.all, snapshot.node, effective_threshold, stale)
    node = fleet(snapshot, claimed, found.all, effective_threshold, price_of, expected_gpus)
    return Attribution(
        devices={d.index: _view(d, claimed, found, node, stale) for d in snapshot.devices},
        workloads=found.all,
        process_holders=owned,
        funnel=node.funnel,
        allocations_from="pod_resources" if claimed.from_pod_resources else "processes",
        problems=claimed.problems,
        event_holders=event_owners(snapshot.events, directory),
        unusable=node.unusable,
    )


def _view(device: Device, claimed: Claimed, found: Workloads, node: Fleet,
          stale: Dict[TargetKey, List[Zombie]]) -> DeviceView:
    index = device.index
    return DeviceView(
        slicing_mode=_slicing_mode(device),
        state=node.states[index],
        price=node.prices[index],
        holders=found.exclusive.get(index, {}),
        sharing=claimed.sharing.get(index, {}),
        offered=claimed.offered[index],
        shares=node.shares[index],
        zombies=[z for key, found_here in stale.items() if key[0] == index for z in found_here],
    )


def _slicing_mode(device: Device) -> str:
    """MIG partitioning only, with the values of the Agent's own gpu check (its MIG instances are
    `mig`), so that one `gpu_slicing_mode` filter selects the same GPUs in both."""
    return "mig-parent" if device.mig_enabled else "none"
