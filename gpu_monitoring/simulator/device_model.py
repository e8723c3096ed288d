"""What a simulated GPU reads at scenario time t.

Gauges follow a slow sine around the device's load with a little deterministic jitter;
cumulative counters (energy, NVLink bytes) are closed-form integrals of the same curve,
so they only ever grow and any two reads give a true rate (those the driver restarts when it
loads, from its last load: see `loaded_at`). Faults whose time has come
change flags, counters and clock-event reasons; none of this keeps mutable state.
"""

import hashlib
import math
from functools import cached_property
from typing import Dict, List, Optional, Tuple

import pynvml

from gpu_monitoring.simulator.scenario import DeviceSpec, Fault, MigSpec

MIB = 1024 * 1024


# The reasons each slowdown fault of a timeline sets.
SLOWDOWN_REASONS = {
    "thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown | pynvml.nvmlClocksEventReasonHwSlowdown,
}


def is_mps_server(process: Dict) -> bool:
    return process.get("name", "").startswith("nvidia-cuda-mps")


# NVLink 4 carries 25 GB/s per direction per link; a busy training job uses a share of it.
NVLINK_BYTES_PER_S_AT_FULL_LOAD = 0.4 * 25e9
PCIE_KB_PER_S_AT_FULL_LOAD = 12e6
PCIE_SHARE = {"tx": 0.6, "rx": 1.0}
# Share of the graphics engine's activity each profiling metric (GPM's and DCGM's alike) reports,
# unless the device's load sets its own `profile`.
PROFILE_SHARES = {"graphics": 1.0, "sm": 0.85, "occupancy": 0.45, "tensor": 0.5, "dram": 0.6,
                  "fp64": 0.02, "fp32": 0.25, "fp16": 0.1}


def _jitter(*parts: object) -> float:
    """A repeatable value in [-1, 1) for the given key."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") / 2**31 - 1.0


class LoadCurve:
    """u(t) = base + amplitude * sin(2*pi*(t + phase) / period), in percent."""

    def __init__(self, load: Dict[str, float], key: object):
        self.base = float(load.get("utilization", 0))
        self.amplitude = float(load.get("amplitude", 0))
        self.period = float(load.get("period", 300))
        self.phase = float(load.get("phase", 0))
        self.jitter = float(load.get("jitter", 2 if self.base else 0))
        self.key = key

    def _omega(self) -> float:
        return 2 * math.pi / self.period

    def at(self, t: float) -> float:
        if not self.base and not self.amplitude:
            return 0.0
        u = self.base + self.amplitude * math.sin(self._omega() * (t + self.phase))
        u += self.jitter * _jitter(self.key, int(t))
        return min(100.0, max(0.0, u))

    def integral(self, t: float) -> float:
        """Integral of the smooth curve from 0 to t, in percent-seconds."""
        w = self._omega()
        swing = self.amplitude / w * (math.cos(w * self.phase) - math.cos(w * (t + self.phase)))
        return max(0.0, self.base * t + swing)

    def mean(self, t1: float, t2: float) -> float:
        if t2 <= t1:
            return self.at(t2)
        return min(100.0, max(0.0, (self.integral(t2) - self.integral(t1)) / (t2 - t1)))


class SimDevice:
    """One physical GPU of a scenario, with its MIG instances."""

    def __init__(self, spec: DeviceSpec, faults: List[Fault]):
        self.spec = spec
        self.index = spec.index
        self.faults = [f for f in faults if f.device == spec.index]
        self.reloads = sorted(f.at for f in faults if f.kind == "driver_reload")
        self.load = LoadCurve(spec.load, ("gpu", spec.uuid))
        self.mig = [SimMigInstance(self, m) for m in spec.mig]
        self._link_counters: tuple = (None, {})

    # --- faults ---------------------------------------------------------------------

    def _active(self, kind: str, now: float) -> List[Fault]:
        return [f for f in self.faults if f.kind == kind and f.active(now)]

    def _fired(self, kind: str, now: float) -> List[Fault]:
        return [f for f in self.faults if f.kind == kind and f.at <= now]

    def lost(self, now: float) -> bool:
        return bool(self._active("gpu_lost", now)) or self.off_the_bus(now)

    def off_the_bus(self, now: float) -> bool:
        """Fallen off the bus (an XID with `lost_for`): gone from the PCIe bus, not only failing its calls."""
        return any(
            "lost_for" in f.params and f.at <= now < f.at + f.params["lost_for"]
            for f in self._fired("xid", now)
        )

    # --- gauges ---------------------------------------------------------------------

    def utilization(self, now: float) -> float:
        return self._over_instances(lambda load: load.at(now))

    def load_integral(self, now: float) -> float:
        """The integral of utilization(), so counters grow with what the gauges show."""
        return self._over_instances(lambda load: load.integral(now))

    def _over_instances(self, of_load) -> float:
        """A value of the GPU's load curve; in MIG mode the instances' values weighted by their memory."""
        if not self.mig:
            return of_load(self.load)
        weights = [m.spec.memory_mib for m in self.mig]
        return sum(of_load(m.load) * w for m, w in zip(self.mig, weights)) / sum(weights)

    def memory_used(self, now: float) -> int:
        if self.mig:
            return sum(m.memory_used(now) for m in self.mig)
        used_mib = self.spec.load.get("memory_used_mib")
        if used_mib is None:
            used_mib = sum(p.get("memory_mib", 0) for p in self.processes(now))
        return int(used_mib * MIB)

    def memory(self, now: float, instance: Optional["SimMigInstance"] = None) -> Tuple[int, int, int]:
        """(total, reserved, used) bytes of the GPU, or of one of its MIG instances (which reserve none)."""
        if instance is not None:
            return instance.spec.memory_mib * MIB, 0, instance.memory_used(now)
        return self.spec["memory_mib"] * MIB, self.spec.get("reserved_mib", 0) * MIB, self.memory_used(now)

    def power_mw(self, now: float) -> int:
        return int(self._power_w(self.utilization(now)) * 1000)

    def _power_w(self, util: float) -> float:
        idle = self.spec["idle_power_w"]
        return idle + (self.spec["power_limit_w"] * 0.9 - idle) * util / 100

    def temperature(self, now: float) -> int:
        if self._active("thermal_slowdown", now):
            return int(self.spec["slowdown_c"] + 2)
        watts = self._power_w(self.utilization(now))
        heat = self.spec.get("degrees_per_watt", 0.06)
        return int(round(self.spec.get("ambient_c", 28) + heat * watts + _jitter(self.spec.uuid, "t", int(now))))

    def memory_temperature(self, now: float) -> int:
        return self.temperature(now) + 6

    def fan_speed(self, now: float) -> int:
        return int(30 + 0.6 * self.utilization(now))

    def clock(self, kind: str, now: float) -> int:
        top = self.spec["clocks_max"][kind]
        util = self.utilization(now)
        if kind == "memory":
            return top
        if kind == "video":
            return int(top * 0.7)
        if util == 0:
            return int(self.spec.get("idle_sm_clock", 345))
        slowed = self.clock_event_reasons(now) & ~pynvml.nvmlClocksEventReasonGpuIdle
        scale = 0.6 if slowed else 1.0
        return int(top * scale * (0.75 + 0.25 * util / 100))

    def performance_state(self, now: float) -> int:
        return 0 if self.utilization(now) > 0 or self.processes(now) else 8

    def clock_event_reasons(self, now: float) -> int:
        bits = 0 if self.utilization(now) > 0 else pynvml.nvmlClocksEventReasonGpuIdle
        for kind, reasons in SLOWDOWN_REASONS.items():
            if self._active(kind, now):
                bits |= reasons
        return bits

    def clock_event_ns(self, reason: int, now: float) -> int:
        """How long a reason has held the clocks down since t=0, in nanoseconds: the time the faults
        that set it have been active (no fault sets the power cap or sync boost)."""
        seconds = sum(
            min(now, fault.at + (fault.duration if fault.duration is not None else math.inf)) - fault.at
            for kind, reasons in SLOWDOWN_REASONS.items() if reasons & reason
            for fault in self._fired(kind, now)
        )
        return int(seconds * 1e9)

    def pcie_link(self, now: float) -> Dict[str, int]:
        link = dict(self.spec["pcie"])
        for fault in self._active("pcie_degraded", now):
            link = dict(link, generation=fault.params["generation"], width=fault.params["width"])
        return link

    def pcie_kb_per_s(self, direction: str, now: float) -> int:
        return int(PCIE_KB_PER_S_AT_FULL_LOAD * PCIE_SHARE[direction] * self.utilization(now) / 100)

    @property
    def nvlink_bridged(self) -> bool:
        """False for a PCIe card without its NVLink bridge (`nvlink_bridge: false`): the driver still
        counts the links, every one inactive, and nothing crosses them."""
        return bool(self.spec.get("nvlink_bridge", True))

    def nvlink_state(self, link: int, now: float) -> int:
        """NVML_FI_DEV_NVLINK_GET_STATE's value: 1 active; an `nvlink_down` fault's `state` (default
        0, inactive; 3 is up with its traffic disabled) while it lasts; 0 on every link without a bridge."""
        if not self.nvlink_bridged:
            return 0
        faults = [f for f in self._active("nvlink_down", now) if f.params.get("link") == link]
        return int(faults[-1].params.get("state", 0)) if faults else 1

    def nvlink_active(self, link: int, now: float) -> bool:
        return self.nvlink_state(link, now) == 1

    @property
    def nvlink_version(self) -> int:
        """The NVLink generation (`nvlink_version`); NVLink 5 (Blackwell) answers its own counters."""
        return int(self.spec.get("nvlink_version", 4))

    def nvlink_link_counters(self, now: float) -> Dict[str, List[int]]:
        """Each link's counters, by name: its share of the GPU's traffic and of the scenario's error
        counts (unequal, as on a real board), and the errors of the faults on that link. One field
        call reads them for every entry: worked out once per instant."""
        if self._link_counters[0] != now:
            self._link_counters = (now, self._count_links(now))
        return self._link_counters[1]

    def _count_links(self, now: float) -> Dict[str, List[int]]:
        weights = self._link_weights
        carried = self.load_integral(now) if self.nvlink_bridged else 0
        kib = NVLINK_BYTES_PER_S_AT_FULL_LOAD * carried / 100 / 1024
        values = {"nvlink_tx_kib": [int(kib * w) for w in weights],
                  "nvlink_rx_kib": [int(kib * 0.97 * w) for w in weights]}
        base = self.spec.get("counters", {})
        fired = self._fired("nvlink_down", now)
        down = [sum(int(f.params.get("count", 1)) for f in fired if f.params.get("link") == link)
                for link in range(len(weights))]
        for name in ("crc_flit", "crc_data", "replay", "recovery"):
            split = _split(base.get(f"nvlink_{name}", 0), weights)
            values[f"nvlink_{name}"] = [part + faults for part, faults in zip(split, down)]
        if self.nvlink_version >= 5:
            values.update(self._nvlink5(now, weights, down))
        return values

    def _nvlink5(self, now: float, weights: List[float], down: List[int]) -> Dict[str, List[int]]:
        """NVLink 5's counters: effective errors at `nvlink_effective_errors_per_hour` over the GPU,
        the BERs packed as nvml.h packs them (mantissa in bits 8-11, exponent in bits 0-7), and FEC
        history bins, codewords corrected with n symbol errors, fewer the more errors."""
        per_hour = float(self.spec.get("nvlink_effective_errors_per_hour", 0))
        links = len(weights)
        effective = [int(per_hour * now / 3600 * w) + faults for w, faults in zip(weights, down)]
        values = {
            "nvlink_effective_errors": effective,
            # A link that counts effective errors has a BER of a few 1e-13, the others a few 1e-15.
            "nvlink_effective_ber": [(1 + link % 9) << 8 | (13 if n else 15) for link, n in enumerate(effective)],
            "nvlink_symbol_ber": [(1 + (link * 7) % 9) << 8 | 9 for link in range(links)],
        }
        for n in range(16):
            values[f"nvlink_fec_{n}"] = [int(now * 5e5 * w / 8 ** n) for w in weights]
        return values

    @cached_property
    def _link_weights(self) -> List[float]:
        """Each link's share of the GPU's NVLink traffic and errors, fixed per GPU and link."""
        links = self.spec.get("nvlink_links", 0)
        raw = [1 + 0.3 * _jitter(self.spec.uuid, "nvlink", link) for link in range(links)]
        return [w * links / sum(raw) for w in raw] if raw else []

    # --- fabric, recovery action, C2C ------------------------------------------------

    def fabric(self, now: float) -> Optional[Dict]:
        """The GPU's NVLink fabric registration (`fabric` in the scenario), as a `fabric_lost` fault
        leaves it: back to `state`, or completed with a failed `status`; None for a GPU without one."""
        fabric = self.spec.get("fabric")
        if fabric is None:
            return None
        for fault in self._active("fabric_lost", now):
            status = fault.params.get("status")
            fabric = dict(fabric, state="completed" if status else fault.params.get("state", "not_started"))
            if status:
                fabric["status"] = status
        return fabric

    def recovery_action(self, now: float) -> int:
        """The action the driver asks for: the latest `recovery_action` fault's while it lasts, else none."""
        active = self._active("recovery_action", now)
        if not active:
            return pynvml.NVML_GPU_RECOVERY_ACTION_NONE
        return getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{active[-1].params['action'].upper()}")

    def c2c_replays(self, link: int, now: float) -> int:
        fired = self._fired("c2c_replay", now)
        return sum(int(f.params.get("count", 1)) for f in fired if f.params.get("link", 0) == link)

    def processes(self, now: float, gpu_instance: Optional[int] = None) -> List[Dict]:
        if self.mig:
            pools = [m for m in self.mig if gpu_instance in (None, m.spec.gpu_instance_id)]
            return [p for m in pools for p in m.processes(now)]
        return [p for p in self.spec.processes if _alive(p, now)]

    def profile(self, load: LoadCurve, t1: float, t2: float) -> Dict[str, float]:
        """Each profiling metric (PROFILE_SHARES' keys), in percent, as `load` (the GPU's or one of its
        MIG instances') averaged between t1 and t2: what GPM and DCGM both measure."""
        busy = load.mean(t1, t2)
        shares = self.spec.load.get("profile", {})
        return {key: busy * shares.get(key, default) for key, default in PROFILE_SHARES.items()}

    def process_shares(self, now: float) -> List[tuple]:
        """Each compute or MPS-client process with its share of the GPU's activity: `sm` in the
        scenario when given (percent of the device), else in proportion to its memory."""
        procs = [p for p in self.processes(now) if not is_mps_server(p)]
        total = sum(p.get("memory_mib", 0) for p in procs) or 1
        return [(p, p["sm"] / 100 if "sm" in p else p.get("memory_mib", 0) / total) for p in procs]

    # --- counters -------------------------------------------------------------------

    def counters(self, now: float) -> Dict[str, float]:
        base = self.spec.get("counters", {})
        links = self.spec.get("nvlink_links", 0)
        loaded = self.loaded_at(now)
        if loaded is None:  # `energy_j`: what the driver had counted before t=0
            energy_j = base.get("energy_j", 0) + self._energy_j(now)
        else:
            energy_j = self._energy_j(now) - self._energy_j(loaded)
        values = {
            "energy_mj": energy_j * 1000,
            "pcie_replay": base.get("pcie_replay", 0) + int(now / 3600),
            # The link retrains (through Recovery) as a pcie_degraded fault begins, and as it ends.
            "pcie_recoveries": base.get("pcie_recoveries", 0) + self._retrains(now),
            "remap_cor": base.get("remap_cor", 0),
            "remap_unc": base.get("remap_unc", 0) + len(self._fired("remap_pending", now)),
            "remap_pending": int(bool(self._active("remap_pending", now))),
            "remap_failure": int(bool(self._fired("remap_failure", now))),
            "retired_sbe": base.get("retired_sbe", 0),
            "retired_dbe": base.get("retired_dbe", 0) + self._count("retired_pending", now),
            "retired_pending": int(bool(self._active("retired_pending", now))),
            "nvlink_link_count": links,
        }
        # Lifetime counts: those before this boot (`ecc_sbe_aggregate` in the scenario) and this boot's;
        # the volatile counts, from the driver's last load.
        for kind in ("ecc_sbe", "ecc_dbe"):
            this_boot = base.get(kind, 0) + self._count(kind, now)
            values[f"{kind}_aggregate"] = base.get(f"{kind}_aggregate", 0) + this_boot
            values[kind] = this_boot if loaded is None else self._count(kind, now, since=loaded)
        for direction, share in PCIE_SHARE.items():
            kib_busy_seconds = PCIE_KB_PER_S_AT_FULL_LOAD * share * self.load_integral(now) / 100
            values[f"pcie_{direction}_bytes"] = int(kib_busy_seconds * 1024)
        # The GPU's NVLink counts are its links' sums, as the *_TOTAL fields are.
        for name in ("crc_flit", "crc_data", "replay", "recovery"):
            values[f"nvlink_{name}"] = base.get(f"nvlink_{name}", 0) + self._count("nvlink_down", now)
        if links:
            values.update({name: sum(per_link) for name, per_link in self.nvlink_link_counters(now).items()})
        return values

    def _retrains(self, now: float) -> int:
        faults = self._fired("pcie_degraded", now)
        return len(faults) + sum(1 for f in faults if f.duration is not None and now >= f.at + f.duration)

    def _count(self, kind: str, now: float, since: float = -math.inf) -> int:
        return sum(int(f.params.get("count", 1)) for f in self._fired(kind, now) if f.at >= since)

    def loaded_at(self, now: float) -> Optional[float]:
        """When the driver was last reloaded, at or before `now`; None if it has not been since t=0.

        The driver restarts two kinds of counter when it loads (nvml.h): the energy
        (nvmlDeviceGetTotalEnergyConsumption, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: "since the driver was
        last reloaded") and the volatile ECC counts (nvmlEccCounterType_t, NVML_VOLATILE_ECC: "reset each
        time the driver loads"); the aggregate ones live in the InfoROM and go on. An error at the reload's
        instant is counted by the new driver."""
        return next((at for at in reversed(self.reloads) if at <= now), None)

    def _energy_j(self, t: float) -> float:
        """Joules drawn from t=0 to t, at the power the load curve gives."""
        return self._power_w(0) * t + (self._power_w(100) - self._power_w(0)) * self.load_integral(t) / 100


class SimMigInstance:
    """A MIG GPU instance with one compute instance, as the mixed and single strategies expose."""

    def __init__(self, parent: SimDevice, spec: MigSpec):
        self.parent = parent
        self.spec = spec
        self.load = LoadCurve({"utilization": spec.utilization, "amplitude": min(5, spec.utilization)}, spec.uuid)

    def utilization(self, now: float) -> float:
        return self.load.at(now)

    def memory_used(self, now: float) -> int:
        return sum(p.get("memory_mib", 0) for p in self.processes(now)) * MIB

    def processes(self, now: float) -> List[Dict]:
        return [
            dict(p, gpu_instance_id=self.spec.gpu_instance_id, compute_instance_id=self.spec.compute_instance_id)
            for p in self.spec.processes
            if _alive(p, now)
        ]


def _split(total: int, weights: List[float]) -> List[int]:
    """A count split by the links' weights (which sum to their number) into parts that sum to it."""
    links = len(weights)
    edges, running = [0], 0.0
    for w in weights:
        running += w
        edges.append(int(total * running / links + 1e-9))
    edges[-1] = total
    return [after - before for before, after in zip(edges, edges[1:])]


def _alive(process: Dict, now: float) -> bool:
    return process.get("start", 0) <= now < process.get("end", math.inf)
