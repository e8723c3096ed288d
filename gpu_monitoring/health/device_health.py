"""Device health: one status per GPU with every reason behind it."""

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import AbstractSet, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence

from gpu_monitoring.health import recovery_actions, xid
from gpu_monitoring.metrics.names import (
    CLOCKS_EVENT_GPU_IDLE,
    CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN,
    CLOCKS_EVENT_HW_THERMAL_SLOWDOWN,
    CLOCKS_EVENT_SW_THERMAL_SLOWDOWN,
    ECC_ERRORS_UNCORRECTED,
    FABRIC_HEALTH_ACCESS_TIMEOUT_RECOVERY,
    FABRIC_HEALTH_DEGRADED_BANDWIDTH,
    FABRIC_HEALTH_ROUTE_RECOVERY,
    FABRIC_HEALTH_ROUTE_UNHEALTHY,
    FABRIC_HEALTH_SUMMARY,
    FABRIC_STATE,
    PCIE_LINK_GENERATION,
    PCIE_LINK_GENERATION_MAX,
    PCIE_LINK_WIDTH,
    PCIE_LINK_WIDTH_MAX,
    REMAPPED_ROWS_FAILED,
    REMAPPED_ROWS_PENDING,
    RETIRED_PAGES_DOUBLE_BIT,
    RETIRED_PAGES_PENDING,
    SM_ACTIVE,
    TEMPERATURE,
    TEMPERATURE_SLOWDOWN_THRESHOLD,
    UTILIZATION_GPU,
)
from gpu_monitoring.snapshot import Device, Event
from gpu_monitoring.status import Status


class Holdable(NamedTuple):
    """A verdict that asks for an action, which held_verdicts keeps until there is evidence of the fix."""

    status: Status
    reason: str
    reset: bool  # the GPU needs a reset or reboot: it counts toward escalation
    since: Optional[float] = None  # when it happened, where that is before the run that saw it


@dataclass
class Health:
    status: Status = Status.OK
    reasons: List[str] = field(default_factory=list)
    # This run's verdicts that ask for an action, by what they are about (`xid:48`, `dbe`, `recovery`).
    holdable: Dict[str, Holdable] = field(default_factory=dict)
    # What is worth saying and is no fault (a GPU passed to a virtual machine): the log's, once, and a
    # WARNING's or CRITICAL's message's; an OK service check carries no message (the Agent drops it).
    notes: List[str] = field(default_factory=list)

    def add(self, status: Status, reason: str, hold: Optional[str] = None, reset: bool = False,
            since: Optional[float] = None) -> None:
        """One reason; `hold` names a verdict that asks for an action, to be held until it is fixed, from
        `since` (a fault the kernel's log tells of after the fact) or else from the run that saw it."""
        if status is Status.OK:
            self.notes.append(reason)
            return
        self.reasons.append(reason)
        self.status = max(self.status, status)
        if hold is not None:
            self.holdable.setdefault(hold, Holdable(status, reason, reset, since))

    @property
    def message(self) -> str:
        """The service check's message: none while OK."""
        return "; ".join(self.reasons + self.notes) if self.status is not Status.OK else ""


def evaluate(
    device: Device,
    previous: Optional[Device],
    events: Iterable[Event],
    xid_ignore: Iterable[int] = (),
    temperature_margin: float = 5,
    offered: Optional[bool] = None,
    nvlink_seen_up: AbstractSet[int] = frozenset(),
    fabric_registered_before: bool = False,
    fabric_grace_over: bool = True,
) -> Health:
    """Apply the health rules to one device, given what it read last run and this run's events.

    `offered` is whether a Kubernetes device plugin advertises the GPU (None: not on Kubernetes, or
    the kubelet did not say): one it does not is a GPU pods wait for, Pending, while it sits unused.
    `nvlink_seen_up` is the NVLink links earlier runs saw up (NvLinkMemory).
    `fabric_registered_before` is whether an earlier run saw it registered with its NVLink fabric
    (FabricMemory); `fabric_grace_over` whether the time a GPU may take to register is over."""
    health = Health()
    if device.lost:
        health.add(Status.CRITICAL, f"GPU lost: {device.error}")
    if offered is False:
        health.add(Status.WARNING,
                   "Kubernetes does not offer this GPU (the device plugin marked it unhealthy, or is down)")
    _events(health, device, list(events), set(xid_ignore))
    _memory(health, device, previous)
    _thermal(health, device.metrics, temperature_margin)
    _nvlink(health, device, nvlink_seen_up)
    _pcie(health, device.metrics)
    _fabric(health, device, fabric_registered_before, fabric_grace_over)
    _recovery(health, device)
    _c2c(health, device)
    return health


def _events(health: Health, device: Device, events: Sequence[Event], ignored: set) -> None:
    """One reason per XID code however many came (a storm is one line, with its count), and one for
    double-bit ECC and GPU-unavailable events. A recovery-action event gives none: it tells of the
    change the recovery action field, read every run (_recovery), already shows, and that the driver
    also logs as XID 154."""
    kinds = {event.kind for event in events}
    xids = Counter(event.code for event in events if event.kind == "xid") if "xid" in kinds else Counter()
    on_nvswitch = FABRIC_STATE in device.metrics  # a GPU that registers with an NVLink fabric
    for code, count in xids.items():
        info = xid.in_context(code, xids.keys(), on_nvswitch)
        if code not in ignored and info.status is not Status.OK:
            held = info.action in xid.HELD_ACTIONS
            since = min(event.timestamp for event in events if event.kind == "xid" and event.code == code)
            health.add(info.status, f"{xid.label(code, count)} ({info.meaning}){_told(events, code)}: {info.advice}",
                       hold=f"xid:{code}" if held else None, reset=held, since=since)
    if "ecc_dbe" in kinds:
        health.add(Status.CRITICAL, "double-bit ECC error event", hold=DBE, reset=True)
    if "gpu_unavailable" in kinds:
        health.add(Status.CRITICAL, "the GPU is unavailable: the driver reported it can no longer be used "
                                    "(NVML GPU-unavailable event); reset the GPU, or reboot the node if that fails",
                   hold=UNAVAILABLE, reset=True)


def _told(events: Sequence[Event], code: int) -> str:
    """Where only the kernel's log told of an XID: said, since NVML raised no event for it."""
    if all(event.source == "kernel" for event in events if event.kind == "xid" and event.code == code):
        return " [from the kernel's record]"
    return ""


# What the held verdicts of a double-bit ECC error, of the driver's recovery action and of a GPU the
# driver reported unavailable are about.
DBE, RECOVERY, UNAVAILABLE = "dbe", "recovery", "unavailable"
# How a reason tells of what came between two runs. Held, it would be false a run later: held_verdicts
# drops it and says when instead.
SINCE_LAST_RUN = " since the last run"


def _memory(health: Health, device: Device, previous: Optional[Device]) -> None:
    m = device.metrics
    now, before = m.get(ECC_ERRORS_UNCORRECTED), (previous.metrics if previous else {}).get(ECC_ERRORS_UNCORRECTED)
    if now is not None and before is not None and now > before:
        health.add(Status.CRITICAL, f"{int(now - before)} uncorrectable ECC errors{SINCE_LAST_RUN}", hold=DBE,
                   reset=True)
    if m.get(REMAPPED_ROWS_FAILED):
        health.add(Status.CRITICAL, "row remapping failed: the GPU needs service")
    if m.get(RETIRED_PAGES_PENDING) and m.get(RETIRED_PAGES_DOUBLE_BIT):
        health.add(Status.CRITICAL, "page retirement pending after double-bit errors: reboot to retire")
    if m.get(REMAPPED_ROWS_PENDING):
        health.add(Status.WARNING, "row remap pending: reset the GPU to apply it")


def _thermal(health: Health, m: dict, margin: float) -> None:
    if m.get(CLOCKS_EVENT_HW_THERMAL_SLOWDOWN) or m.get(CLOCKS_EVENT_SW_THERMAL_SLOWDOWN):
        health.add(Status.WARNING, "thermal slowdown is lowering clocks")
    if m.get(CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN):
        health.add(Status.WARNING, "hardware power-brake slowdown is lowering clocks")
    temperature, threshold = m.get(TEMPERATURE), m.get(TEMPERATURE_SLOWDOWN_THRESHOLD)
    if temperature is not None and threshold and temperature >= threshold - margin:
        health.add(
            Status.WARNING,
            f"temperature {temperature:.0f}°C is within {margin:g}°C of the slowdown threshold {threshold:.0f}°C",
        )


# NVML_FI_DEV_NVLINK_GET_STATE's values. nvml.h (CUDA 13.3): INACTIVE 0, ACTIVE 1, SLEEP 2 (low power,
# not down). NVML's change log (v610 to v615) adds ACTIVE_TRAFFIC_DISABLED, 3: trained, yet carrying
# nothing, a fault. Any other value is none of these, and is neither trusted up nor blamed down.
LINK_INACTIVE, LINK_ACTIVE, LINK_SLEEP, LINK_TRAFFIC_DISABLED = 0, 1, 2, 3
LINK_UP = (LINK_ACTIVE, LINK_SLEEP)


def _nvlink(health: Health, device: Device, seen_up: AbstractSet[int]) -> None:
    # An inactive link is down on a GPU that has another link up, or that had this link up in an
    # earlier run (of this Agent or one before it). One whose every link has been inactive all along
    # has no NVLink peer: an A100 or H100 PCIe card without a bridge still counts its links
    # (NVML_FI_DEV_NVLINK_LINK_COUNT) and reads each one inactive.
    states = list(enumerate(device.nvlink_states))
    any_up = any(state in LINK_UP for _, state in states)
    down = [link for link, state in states if state == LINK_INACTIVE and (any_up or link in seen_up)]
    if down:
        health.add(Status.WARNING, f"NVLink down: link {_links(down)}")
    disabled = [link for link, state in states if state == LINK_TRAFFIC_DISABLED]
    if disabled:
        health.add(Status.WARNING, f"NVLink up but its traffic disabled: link {_links(disabled)}")
    unknown = [f"{link} ({state})" for link, state in states if state is not None and state not in _KNOWN]
    if unknown:
        health.add(Status.WARNING, f"NVLink state unknown: link {', '.join(unknown)}")


_KNOWN = (LINK_INACTIVE, LINK_ACTIVE, LINK_SLEEP, LINK_TRAFFIC_DISABLED)


def _links(links: Iterable[int]) -> str:
    return ", ".join(map(str, links))


def links_up(device: Device) -> FrozenSet[int]:
    return frozenset(link for link, state in enumerate(device.nvlink_states) if state in LINK_UP)


class NvLinkMemory:
    """The NVLink links, by GPU UUID, seen up since the check first ran; kept as JSON (`dumps`,
    `loads`) in the Agent's persistent cache, so that a link that goes down across a restart is
    still a link that was up."""

    def __init__(self, up: Optional[Dict[str, FrozenSet[int]]] = None) -> None:
        self._up: Dict[str, FrozenSet[int]] = dict(up or {})

    def seen_up(self, uuid: Optional[str]) -> FrozenSet[int]:
        return self._up.get(uuid or "", frozenset())

    def remember(self, devices: Iterable[Device]) -> bool:
        """Add this run's links up; whether that changed anything. Only GPUs this run lists are kept
        (a lost one too, while it is listed), so a GPU that is gone is forgotten and the memory stays
        node-sized."""
        up = {d.uuid: self.seen_up(d.uuid) | links_up(d) for d in devices if d.uuid}
        up = {uuid: links for uuid, links in up.items() if links}
        changed = up != self._up
        self._up = up
        return changed

    def dumps(self) -> str:
        return json.dumps({uuid: sorted(links) for uuid, links in self._up.items()}, sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> "NvLinkMemory":
        """The memory `dumps` wrote; empty where there is none or it cannot be read (a GPU then has
        to show a link up again before a link of it counts as down)."""
        try:
            raw = json.loads(text) if text else {}
            return cls({str(uuid): frozenset(int(link) for link in links) for uuid, links in raw.items()})
        except (ValueError, TypeError, AttributeError):
            return cls()


def _pcie(health: Health, m: dict) -> None:
    width, max_width = m.get(PCIE_LINK_WIDTH), m.get(PCIE_LINK_WIDTH_MAX)
    gen, max_gen = m.get(PCIE_LINK_GENERATION), m.get(PCIE_LINK_GENERATION_MAX)
    # An idle GPU lowers its link generation to save power; only a busy one is judged on it.
    busy = not m.get(CLOCKS_EVENT_GPU_IDLE) and m.get(UTILIZATION_GPU, m.get(SM_ACTIVE, 0)) > 0
    degraded_width = width is not None and max_width and width < max_width
    degraded_gen = busy and gen is not None and max_gen and gen < max_gen
    if degraded_width or degraded_gen:
        health.add(Status.WARNING,
                   f"PCIe link at Gen{_n(gen)} x{_n(width)}, capable of Gen{_n(max_gen)} x{_n(max_width)}")


def _n(value: Optional[float]) -> str:
    return "?" if value is None else f"{value:.0f}"


# nvml.h's NVML_GPU_FABRIC_STATE_*, and NVML_GPU_FABRIC_HEALTH_SUMMARY_* (as fabric.* series carry them).
FABRIC_REGISTERING = {1: "not started", 2: "in progress"}
FABRIC_COMPLETED = 3
FABRIC_UNHEALTHY, FABRIC_LIMITED_CAPACITY = 2, 3
# The fabric health flags that degrade a GPU's NVLink traffic, in the words a message gives them.
FABRIC_WARNINGS = {
    FABRIC_HEALTH_DEGRADED_BANDWIDTH: "bandwidth degraded",
    FABRIC_HEALTH_ROUTE_RECOVERY: "route recovery in progress",
    FABRIC_HEALTH_ROUTE_UNHEALTHY: "a route is unhealthy",
    FABRIC_HEALTH_ACCESS_TIMEOUT_RECOVERY: "recovering from an access timeout",
}
FABRIC_MANAGER = "check nvidia-fabricmanager and its log on this node"


def _fabric(health: Health, device: Device, registered_before: bool, grace_over: bool) -> None:
    """A GPU on an NVLink fabric runs no CUDA work until the fabric manager has registered it. One
    still registering after the grace period, one that was registered and is no longer, and one
    whose registration failed or whose configuration the fabric finds incorrect (`fabric_error` names
    each, nvml.fabric) are CRITICAL. A GPU with no fabric (state NOT_SUPPORTED, or a driver that
    does not answer) has no fabric.state series and nothing to judge."""
    m = device.metrics
    for value in device.fabric_untrusted:
        health.add(Status.WARNING, f"NVLink fabric {value} is not one NVML defines: not trusted")
    state = m.get(FABRIC_STATE)
    if device.fabric_error:
        health.add(Status.CRITICAL, f"NVLink fabric {device.fabric_error}: CUDA work cannot use this GPU; "
                                    f"{FABRIC_MANAGER}")
    elif state in FABRIC_REGISTERING and (registered_before or grace_over):
        lost = "lost its NVLink fabric registration" if registered_before else "not registered with its NVLink fabric"
        health.add(Status.CRITICAL, f"{lost} (state: {FABRIC_REGISTERING[state]}): CUDA work cannot start on "
                                    f"this GPU; {FABRIC_MANAGER}")
    summary = m.get(FABRIC_HEALTH_SUMMARY)
    if summary == FABRIC_UNHEALTHY:
        health.add(Status.CRITICAL, f"NVLink fabric health is unhealthy; {FABRIC_MANAGER}")
    elif summary == FABRIC_LIMITED_CAPACITY:
        health.add(Status.WARNING, "NVLink fabric runs at limited capacity")
    for name, words in FABRIC_WARNINGS.items():
        if m.get(name):
            health.add(Status.WARNING, f"NVLink fabric: {words}")


class FabricMemory:
    """The GPUs, by UUID, seen registered with their NVLink fabric since the check started."""

    def __init__(self) -> None:
        self._registered: FrozenSet[str] = frozenset()

    def registered_before(self, uuid: Optional[str]) -> bool:
        return uuid in self._registered

    def remember(self, devices: Iterable[Device]) -> None:
        """Add this run's registered GPUs; only GPUs this run lists are kept."""
        self._registered = frozenset(
            d.uuid for d in devices
            if d.uuid and (d.uuid in self._registered or d.metrics.get(FABRIC_STATE) == FABRIC_COMPLETED)
        )


def _recovery(health: Health, device: Device) -> None:
    if device.recovery_action in (None, recovery_actions.NONE):
        return
    action = recovery_actions.describe(device.recovery_action)
    status = Status[action.severity.upper()]
    health.add(status, f"the driver asks for recovery action {action.name.replace('_', ' ')}: {action.advice}",
               hold=RECOVERY, reset=status is Status.CRITICAL)


def _c2c(health: Health, device: Device) -> None:
    # A Grace GPU's C2C links are all up while it is healthy: one down slows its CPU memory traffic.
    if device.c2c_down:
        health.add(Status.WARNING, f"NVLink-C2C down: link {', '.join(map(str, device.c2c_down))} "
                                   "(the GPU's link to its Grace CPU)")
