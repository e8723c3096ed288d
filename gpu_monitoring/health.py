"""Device health: one status per GPU with every reason behind it."""

from dataclasses import dataclass, field
from typing import FrozenSet, Iterable, List, Optional

from . import xid
from .service_checks import Status
from .snapshot import Device, Event


@dataclass
class Health:
    status: Status = Status.OK
    reasons: List[str] = field(default_factory=list)

    def add(self, status: Status, reason: str) -> None:
        self.reasons.append(reason)
        self.status = max(self.status, status)

    @property
    def message(self) -> str:
        return "; ".join(self.reasons)


def evaluate(
    device: Device,
    previous: Optional[Device],
    events: Iterable[Event],
    xid_ignore: Iterable[int] = (),
    temperature_margin: float = 5,
    offered: Optional[bool] = None,
    nvlink_seen_up: bool = False,
) -> Health:
    """Apply the health rules to one device, given what it read last run and this run's events.

    `offered` is whether a Kubernetes device plugin advertises the GPU (None: not on Kubernetes, or
    the kubelet did not say): one it does not is a GPU pods wait for, Pending, while it sits unused.
    `nvlink_seen_up` is whether an earlier run saw one of its NVLink links up (NvLinkMemory)."""
    health = Health()
    if device.lost:
        health.add(Status.CRITICAL, f"GPU lost: {device.error}")
    if offered is False:
        health.add(Status.WARNING,
                   "Kubernetes does not offer this GPU (the device plugin marked it unhealthy, or is down)")
    _events(health, events, set(xid_ignore))
    _memory(health, device, previous)
    _thermal(health, device.metrics, temperature_margin)
    _nvlink(health, device, nvlink_seen_up)
    _pcie(health, device.metrics)
    return health


def _events(health: Health, events: Iterable[Event], ignored: set) -> None:
    for event in events:
        if event.kind == "xid" and event.code not in ignored:
            info = xid.describe(event.code)
            if info.status is not Status.OK:
                health.add(info.status, f"XID {event.code} ({info.meaning}): {info.advice}")
        elif event.kind == "ecc_dbe":
            health.add(Status.CRITICAL, "double-bit ECC error event")


def _memory(health: Health, device: Device, previous: Optional[Device]) -> None:
    m = device.metrics
    now, before = m.get("ecc.errors.uncorrected"), (previous.metrics if previous else {}).get("ecc.errors.uncorrected")
    if now is not None and before is not None and now > before:
        health.add(Status.CRITICAL, f"{int(now - before)} uncorrectable ECC errors since the last run")
    if m.get("remapped_rows.failed"):
        health.add(Status.CRITICAL, "row remapping failed: the GPU needs service")
    if m.get("retired_pages.pending") and m.get("retired_pages.double_bit"):
        health.add(Status.CRITICAL, "page retirement pending after double-bit errors: reboot to retire")
    if m.get("remapped_rows.pending"):
        health.add(Status.WARNING, "row remap pending: reset the GPU to apply it")


def _thermal(health: Health, m: dict, margin: float) -> None:
    if m.get("clocks_event.hw_thermal_slowdown") or m.get("clocks_event.sw_thermal_slowdown"):
        health.add(Status.WARNING, "thermal slowdown is lowering clocks")
    if m.get("clocks_event.hw_power_brake_slowdown"):
        health.add(Status.WARNING, "hardware power-brake slowdown is lowering clocks")
    temperature, threshold = m.get("temperature"), m.get("temperature.slowdown_threshold")
    if temperature is not None and threshold and temperature >= threshold - margin:
        health.add(
            Status.WARNING,
            f"temperature {temperature:.0f}°C is within {margin:g}°C of the slowdown threshold {threshold:.0f}°C",
        )


def _nvlink(health: Health, device: Device, seen_up: bool) -> None:
    # An inactive link is down on a GPU that has had a link up, now or in an earlier run. One whose
    # every link has been inactive all along has no NVLink peer: an A100 or H100 PCIe card without a
    # bridge still counts its links (NVML_FI_DEV_NVLINK_LINK_COUNT) and reads each one inactive.
    if device.nvlink_down and (seen_up or _links_up(device)):
        health.add(Status.WARNING, f"NVLink down: link {', '.join(map(str, device.nvlink_down))}")


def _links_up(device: Device) -> bool:
    return bool(device.metrics.get("nvlink.links.active"))


class NvLinkMemory:
    """The GPUs, by UUID, that have had an NVLink link up since the check started."""

    def __init__(self) -> None:
        self._up: FrozenSet[str] = frozenset()

    def seen_up(self, uuid: Optional[str]) -> bool:
        return uuid in self._up

    def remember(self, devices: Iterable[Device]) -> None:
        """Add this run's GPUs with a link up. Only GPUs this run lists are kept (a lost one too,
        while it is listed), so a GPU that is gone is forgotten and the memory stays node-sized."""
        self._up = frozenset(
            d.uuid for d in devices if d.uuid and (d.uuid in self._up or _links_up(d))
        )


def _pcie(health: Health, m: dict) -> None:
    width, max_width = m.get("pcie.link.width"), m.get("pcie.link.width.max")
    gen, max_gen = m.get("pcie.link.generation"), m.get("pcie.link.generation.max")
    # An idle GPU lowers its link generation to save power; only a busy one is judged on it.
    busy = not m.get("clocks_event.gpu_idle") and m.get("utilization.gpu", m.get("sm_active", 0)) > 0
    degraded_width = width is not None and max_width and width < max_width
    degraded_gen = busy and gen is not None and max_gen and gen < max_gen
    if degraded_width or degraded_gen:
        health.add(Status.WARNING,
                   f"PCIe link at Gen{_n(gen)} x{_n(width)}, capable of Gen{_n(max_gen)} x{_n(max_width)}")


def _n(value: Optional[float]) -> str:
    return "?" if value is None else f"{value:.0f}"
