"""Verdicts that ask for an action, held until there is evidence of the fix.

A double-bit ECC error or an XID that asks for a GPU reset is seen in one run; the run after it, NVML
shows nothing wrong, though nothing was done. A service check monitor resolves on the next OK, so
such a verdict is held: every later run repeats it, with when it began, until one of these shows the fix:

- the node rebooted: the kernel's boot ID changed (`/proc/sys/kernel/random/boot_id`, a new random
  UUID each boot: the kernel's Documentation/admin-guide/sysctl/kernel.rst, "random");
- the driver was loaded again, which is also what a GPU reset does to the GPU's driver state: a counter
  NVML documents as restarting with the driver went back. The energy counter counts "since the driver
  was last reloaded" (nvml.h, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION and nvmlDeviceGetTotalEnergyConsumption)
  and the volatile ECC counts "are reset each time the driver loads" (nvml.h, nvmlEccCounterType_t);
- the driver's recovery action, having asked for one, reads NONE again;
- `fault_hold` seconds passed (0: nothing is held past its own run).

Held verdicts are kept by GPU UUID in the check's persistent cache (`dumps`/`loads`), so an Agent
restart keeps them; the check judges the snapshot in local and sidecar mode alike. A GPU whose verdicts
asked for a reset or reboot `ESCALATE_AFTER` times within `WINDOW` escalates: it should leave service.
The node's own holds (ports that flapped) are kept under `NODE`, and only a reboot or time clears them.
"""

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional

from gpu_monitoring.health.device_health import SINCE_LAST_RUN, Health, Holdable
from gpu_monitoring.metrics.names import ECC_ERRORS_CORRECTED, ECC_ERRORS_UNCORRECTED, ENERGY_CONSUMED
from gpu_monitoring.snapshot import Device
from gpu_monitoring.status import Status

NODE = "node"
WINDOW = 7 * 86400
ESCALATE_AFTER = 3
# The counters the driver restarts when it loads: one that went back says it was loaded again.
DRIVER_LOAD_COUNTERS = (ENERGY_CONSUMED, ECC_ERRORS_CORRECTED, ECC_ERRORS_UNCORRECTED)


@dataclass
class Held:
    status: int
    reason: str
    since: float  # when the verdict was first seen, in seconds since the epoch


@dataclass
class Record:
    """What is held of one GPU (or of the node), and what evidence of a fix is compared against."""

    held: Dict[str, Held] = field(default_factory=dict)
    resets: List[float] = field(default_factory=list)  # when each verdict asking for a reset began
    counters: Dict[str, float] = field(default_factory=dict)  # the driver-load counters last read
    recovery_asked: bool = False  # the recovery action asked for one while something was held


class HeldVerdicts:
    def __init__(self, hold_seconds: float, boot_id: Optional[str] = None,
                 records: Optional[Dict[str, Record]] = None) -> None:
        self.hold_seconds = hold_seconds
        self.boot_id = boot_id
        self.records: Dict[str, Record] = dict(records or {})

    def booted(self, boot_id: Optional[str]) -> None:
        """A new boot ID is a reboot, which fixes what was held (the reset history stays)."""
        if boot_id is None:
            return
        if self.boot_id is not None and boot_id != self.boot_id:
            for record in self.records.values():
                record.held.clear()
        self.boot_id = boot_id

    def judge_gpu(self, device: Device, health: Health, now: float) -> None:
        """Add to `health` what stays held of this GPU, holding what this run asks for."""
        if not device.uuid:
            return
        record = self.records.get(device.uuid) or Record()
        if _fixed(record, device):
            record.held.clear()
        self._judge(device.uuid, record, health, now)
        record.recovery_asked = bool(record.held) and (record.recovery_asked or device.recovery_action not in (None, 0))
        record.counters = _driver_load_counters(device) or record.counters

    def judge_node(self, health: Health, now: float) -> None:
        self._judge(NODE, self.records.get(NODE) or Record(), health, now)

    def _judge(self, key: str, record: Record, health: Health, now: float) -> None:
        _expire(record, health.holdable, now, self.hold_seconds)
        for name, verdict in health.holdable.items():
            if name not in record.held:
                since = min(verdict.since or now, now)
                # What happened, without "since the last run": the held message says when.
                record.held[name] = Held(int(verdict.status), verdict.reason.replace(SINCE_LAST_RUN, ""), since)
                if verdict.reset:
                    record.resets.append(since)
        until = _UNTIL[key == NODE]
        for name, held in record.held.items():
            if name not in health.holdable:
                health.add(Status(held.status), f"{held.reason} (held since {_when(held.since)}: {until})")
        record.resets = [t for t in record.resets if now - t < WINDOW]
        if len(record.resets) >= ESCALATE_AFTER:
            health.add(Status.CRITICAL, f"needed a reset {len(record.resets)} times in 7 days: take it out of service "
                                        "and open a support case")
        if record.held or record.resets:
            self.records[key] = record
        else:
            self.records.pop(key, None)

    def driver_loaded(self, at: float) -> None:
        """The kernel's log says the driver loaded at `at`: what a GPU held from before is fixed, as after a
        reload NVML shows (the node's own holds are a network's, which a driver load does not touch)."""
        for key, record in self.records.items():
            if key != NODE:
                record.held = {name: held for name, held in record.held.items() if held.since >= at}

    def forget_others(self, uuids: Iterable[str]) -> None:
        """Keep only the GPUs this node lists (and the node's own): a GPU gone from it is forgotten."""
        kept = set(uuids) | {NODE}
        self.records = {key: record for key, record in self.records.items() if key in kept}

    @property
    def held_count(self) -> int:
        return sum(len(record.held) for record in self.records.values())

    @property
    def escalated_count(self) -> int:
        return sum(len(record.resets) >= ESCALATE_AFTER for key, record in self.records.items() if key != NODE)

    def dumps(self) -> str:
        return json.dumps({"boot_id": self.boot_id, "records": {k: asdict(r) for k, r in self.records.items()}},
                          sort_keys=True)

    @classmethod
    def loads(cls, text: Optional[str], hold_seconds: float) -> "HeldVerdicts":
        """What `dumps` wrote; nothing held where there is none or it cannot be read."""
        try:
            raw = json.loads(text) if text else {}
            records = {str(key): _record(value) for key, value in raw.get("records", {}).items()}
            boot_id = raw.get("boot_id")
            return cls(hold_seconds, boot_id if isinstance(boot_id, str) else None, records)
        except (ValueError, TypeError, AttributeError, KeyError):
            return cls(hold_seconds)


_UNTIL = {False: "until the GPU is reset, the driver reloaded or the node rebooted",
          True: "until the node reboots or fault_hold passes"}


def _fixed(record: Record, device: Device) -> bool:
    """Whether this run shows the fix of what is held: a driver-load counter went back (the driver
    was loaded again), or the recovery action, having asked for one, reads NONE."""
    counters = _driver_load_counters(device)
    reloaded = any(value < record.counters[name] for name, value in counters.items() if name in record.counters)
    return reloaded or (record.recovery_asked and device.recovery_action == 0)


def _driver_load_counters(device: Device) -> Dict[str, float]:
    return {name: device.metrics[name] for name in DRIVER_LOAD_COUNTERS if name in device.metrics}


def _expire(record: Record, raised: Dict[str, Holdable], now: float, hold_seconds: float) -> None:
    """Drop what was held for `hold_seconds`, unless this run raises it again."""
    record.held = {name: held for name, held in record.held.items()
                   if name in raised or now - held.since < hold_seconds}


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _record(raw: dict) -> Record:
    return Record(
        held={str(k): Held(int(v["status"]), str(v["reason"]), float(v["since"])) for k, v in raw["held"].items()},
        resets=[float(t) for t in raw["resets"]],
        counters={str(k): float(v) for k, v in raw["counters"].items()},
        recovery_asked=bool(raw["recovery_asked"]),
    )
