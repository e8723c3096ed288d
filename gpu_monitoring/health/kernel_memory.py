"""What the kernel's log told that outlives the run that read it, for as long as the boot lasts.

The driver says a GPU's UUID beside its bus ID once a boot (`NVRM: GPU at PCI:…: GPU-…`, before the
first XID it reports of it), that it failed to initialise a GPU once (at the probe, or at the first open),
and that it loaded once per load. Each line is read once; what it says holds on: a GPU NVML can no longer
open keeps its UUID, node.health keeps saying why a GPU on the bus never came up, and a verdict raised
before the driver's last load is not held. Kept in the check's persistent cache, so a restart keeps it;
a new boot ID forgets it.
"""

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional

from gpu_monitoring.node.driver_gpus import nvml_bus_id
from gpu_monitoring.snapshot import Device, Event

# The driver's code of a failed RmInitAdapter, `0x26:0x56:1474` (the status, where it failed, and the
# source line): what NVIDIA support asks for.
_INIT_CODE = re.compile(r"0x[0-9a-f]+:0x[0-9a-f]+:\d+", re.IGNORECASE)


_REMEMBERED = ("gpu_uuid", "init_failed", "driver_loaded")


@dataclass
class KernelMemory:
    boot_id: Optional[str] = None
    uuids: Dict[str, str] = field(default_factory=dict)  # GPU UUID by PCI bus ID (NVML's form)
    init_failures: Dict[str, str] = field(default_factory=dict)  # the driver's code by PCI bus ID
    driver_loaded: float = 0.0  # when the driver last loaded, as the log says; 0 where it did not say

    def learn(self, events: Iterable[Event], boot_id: Optional[str]) -> bool:
        """Take in a run's kernel events; whether anything changed (to keep)."""
        told = [event for event in events if event.source == "kernel" and event.kind in _REMEMBERED]
        if not told and (boot_id is None or boot_id == self.boot_id):
            return False  # a steady run's
        before = asdict(self)
        if boot_id is not None and boot_id != self.boot_id:
            self.uuids, self.init_failures, self.driver_loaded, self.boot_id = {}, {}, 0.0, boot_id
        for event in told:
            bus_id = nvml_bus_id(event.pci_bus_id) if event.pci_bus_id else None
            if event.kind == "gpu_uuid" and bus_id and event.device_uuid:
                self.uuids[bus_id] = event.device_uuid
            elif event.kind == "init_failed" and bus_id:
                self.init_failures[bus_id] = _failure(event.detail)
            elif event.kind == "driver_loaded":
                self.driver_loaded = max(self.driver_loaded, event.timestamp)
                self.init_failures = {}  # a new load tries every GPU again
        return asdict(self) != before

    def name(self, devices: List[Device], events: List[Event]) -> None:
        """A GPU or a kernel event without a UUID takes the one the driver gave its bus ID."""
        for device in devices:
            device.uuid = device.uuid or self._uuid(device.pci_bus_id)
        for event in events:
            event.device_uuid = event.device_uuid or self._uuid(event.pci_bus_id)

    def _uuid(self, pci_bus_id: Optional[str]) -> Optional[str]:
        return self.uuids.get(nvml_bus_id(pci_bus_id) or "") if pci_bus_id else None

    def superseded(self, event: Event) -> bool:
        """A kernel event from before the driver's last load: history, whose verdict that load answered."""
        return event.source == "kernel" and event.timestamp < self.driver_loaded

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, text: Optional[str]) -> "KernelMemory":
        try:
            raw = json.loads(text) if text else {}
            return cls(raw.get("boot_id"), {str(k): str(v) for k, v in raw.get("uuids", {}).items()},
                       {str(k): str(v) for k, v in raw.get("init_failures", {}).items()},
                       float(raw.get("driver_loaded", 0.0)))
        except (ValueError, TypeError, AttributeError):
            return cls()


def _failure(detail: Optional[str]) -> str:
    """How node.health names the driver's failure: the call and its code, as the driver printed them."""
    if detail and _INIT_CODE.fullmatch(detail):
        return f"RmInitAdapter failed! {detail}"
    return detail or "the driver's initialisation failed"
