"""One collection of a whole node: every device through every enabled collector.

Field-backed values of a device come from one batched read (nvml.readings, whose docstring also
lists the NVML calls a run makes besides it and why no field replaces them).
"""

import logging
import time
from typing import Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Tuple

from gpu_monitoring import snapshot
from gpu_monitoring.collectors import COLLECTOR_NAMES
from gpu_monitoring.collectors.base import Collector
from gpu_monitoring.collectors.c2c import C2c
from gpu_monitoring.collectors.clocks import Clocks
from gpu_monitoring.collectors.fabric import Fabric
from gpu_monitoring.collectors.inventory import Inventory
from gpu_monitoring.collectors.memory import Memory
from gpu_monitoring.collectors.memory_errors import MemoryErrors
from gpu_monitoring.collectors.mig import Mig
from gpu_monitoring.collectors.nvlink import NvLink
from gpu_monitoring.collectors.pcie import Pcie
from gpu_monitoring.collectors.processes import Processes
from gpu_monitoring.collectors.recovery import Recovery
from gpu_monitoring.collectors.series import store
from gpu_monitoring.collectors.thermal import Thermal
from gpu_monitoring.collectors.utilization import Gpm, Utilization
from gpu_monitoring.kube.allocations import AllocationReader
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.node.driver_gpus import name_lost_devices, read_driver_gpus
from gpu_monitoring.node.hardware import HardwareReader
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.errors import CannotAnswer, GpuLost, NvmlUninitialized
from gpu_monitoring.nvml.events import EventWatcher, RawEvent
from gpu_monitoring.nvml.readings import Readings
from gpu_monitoring.nvml.session import NvmlSession

log = logging.getLogger(__name__)

# Events kept for runs that keep failing before they submit: enough for an XID storm, bounded memory.
MAX_UNDELIVERED = 10000
IDENTITY = ("uuid", "name", "architecture", "pci_bus_id", "minor_number", "mig_enabled")
NVML_IDENTITY = IDENTITY[:-1]  # read here; MIG mode by the MIG collector


class NodeReader:
    """Owns the NVML session; `read()` returns a Snapshot and never submits.

    A lost GPU is marked lost and the others are read in the same run. It is read again
    every run, and while it stays lost the session is restarted every
    `lost_restart_interval` seconds so a GPU that was reset gets a fresh handle. A lost
    NVML initialisation (driver reload) restarts the session and the run is tried again.

    A lost GPU keeps its name: what NVML told of it before (at event registration, or in an
    earlier collection), else the kernel driver's record of it under the proc root (driver_gpus).

    NVML hands out each event once, so drained events stay with the reader, repeated in
    every snapshot, until `acknowledge()` says a run submitted them: a run that fails after
    draining loses nothing.

    The collectors skip reads that give only what `profile` does not send; a sidecar, serving
    every profile, reads everything.
    """

    def __init__(
        self,
        session: NvmlSession,
        disabled: Iterable[str] = (),
        proc_root: Optional[str] = "/proc",
        allocations: Optional[AllocationReader] = None,
        lost_restart_interval: float = 300.0,
        watch_events: bool = True,
        profile: Profile = EVERYTHING,
        sysfs_root: Optional[str] = None,
        clock: Callable[[], float] = time.time,
    ):
        self.session = session
        self.disabled = set(disabled)
        self.proc_root = proc_root
        self.allocations = allocations
        self.lost_restart_interval = lost_restart_interval
        # The sidecar waits on NVML events in a thread of its own; one run of the check drains them here.
        self.events = EventWatcher(clock) if watch_events else None
        self._undelivered: List[RawEvent] = []
        self._in_snapshot = 0
        self._lost_since: Optional[float] = None
        self._last_seen: Dict[int, snapshot.Device] = {}
        self._readings: Dict[NvmlDevice, Readings] = {}  # each device's, for as long as the session lasts
        # The node around the GPUs (PCI bus, driver record, ports, boot ID): none without a sysfs root;
        # `clock` is the one its counters follow.
        self.hardware = HardwareReader(sysfs_root, proc_root, clock) if sysfs_root else None
        self.sysfs_root = sysfs_root  # where the processes' workload cgroups are found too
        self.clock = clock
        self.collectors = self._build_collectors(profile)

    def _build_collectors(self, profile: Profile) -> List[Collector]:
        enabled = [name for name in COLLECTOR_NAMES if name not in self.disabled]
        gpm = Gpm(pcie="pcie" in enabled, profile=profile)
        processes = Processes(self.proc_root, profile, self.sysfs_root)
        shared = {
            "utilization": Utilization(profile),
            "gpm": gpm,
            "memory": Memory(profile),
            "processes": processes,
        }
        per_device = {
            **shared,
            "thermal": Thermal(profile),
            "clocks": Clocks(profile),
            "pcie": Pcie(gpm if "gpm" in enabled else None, profile),
            "nvlink": NvLink(profile),
            "fabric": Fabric(profile),
            "c2c": C2c(profile),
            "recovery": Recovery(profile),
            "memory_errors": MemoryErrors(profile),
            "inventory": Inventory(profile=profile),
            "mig": Mig([shared[n] for n in ("utilization", "gpm", "memory", "processes") if n in enabled], profile,
                       processes if "processes" in enabled else None),
        }
        return [per_device[name] for name in enabled]

    def read(self) -> snapshot.Snapshot:
        if not self.session.started:
            self.session.start()
        if self._lost_gpu_restart_due():
            self._drain()
            log.info("a GPU is still lost; restarting NVML to look for it again")
            self.restart()
        for collector in self.collectors:
            collector.begin_run()
        try:
            result = self._collect()
        except NvmlUninitialized as e:
            log.warning("NVML lost its initialisation (%s); starting it again", e)
            self.restart()
            result = self._collect()
        lost = any(device.lost for device in result.devices)
        self._lost_since = (self._lost_since or time.monotonic()) if lost else None
        return result

    def _drain(self) -> None:
        if self.events is None:
            return
        try:
            self._undelivered += self.events.drain()
        except CannotAnswer as e:
            log.info("NVML events: %s; registering again", e)
            self.events.close()
        dropped = len(self._undelivered) - MAX_UNDELIVERED
        if dropped > 0:
            log.warning("%d NVML events were never submitted (every run failed); dropping the oldest", dropped)
            del self._undelivered[:dropped]
            self._in_snapshot = max(self._in_snapshot - dropped, 0)

    def acknowledge(self) -> None:
        """The events of the last snapshot were submitted: they are not handed out again."""
        del self._undelivered[:self._in_snapshot]
        self._in_snapshot = 0

    def _lost_gpu_restart_due(self) -> bool:
        if self._lost_since is None or time.monotonic() - self._lost_since < self.lost_restart_interval:
            return False
        self._lost_since = time.monotonic()
        return True

    def restart(self) -> None:
        self.close()
        self.session.start()

    def close(self) -> None:
        for collector in self.collectors:
            collector.forget()
        if self.events is not None:
            self.events.close()
        self._readings = {}
        self.session.stop()

    def _problems(self) -> List[str]:
        """Faults that lose data without failing the run, for the check's nvml.can_connect to tell."""
        found = [f"GPU {device.index}: NVML denies {', '.join(device.denied_functions())} (no permission: "
                 "give the Agent access to the GPU device nodes)"
                 for device in self.session.devices if device.denied_functions()]
        if self.events is not None and self.events.problem and not self.events.unsupported:
            found.append(f"XID and ECC events are not watched: {self.events.problem}")
        return found

    def _collect(self) -> snapshot.Snapshot:
        self._drain()
        raw_events = list(self._undelivered)
        self._in_snapshot = len(raw_events)
        devices = [self._device(device) for device in self.session.devices]
        if any(device.uuid is None for device in devices):
            name_lost_devices(devices, read_driver_gpus(self.proc_root))
        if self.events is not None:
            self.events.register([d for d in self.session.devices if d.handle is not None])
        node = snapshot.Node(
            driver_version=self.session.driver_version,
            nvml_version=self.session.nvml_version,
            cuda_driver_version=self.session.cuda_driver_version,
            problems=self._problems(),
        )
        if self.hardware is not None:
            self.hardware.read_into(node)
            self.hardware.read_workloads(node, _processes(devices))
        return snapshot.Snapshot(
            allocations=self.allocations.read(_users(devices)) if self.allocations else snapshot.Allocations(),
            timestamp=self.clock(),
            node=node,
            devices=devices,
            events=[snapshot.Event(**event.record()) for event in raw_events],
        )

    def _device(self, device: NvmlDevice) -> snapshot.Device:
        out = snapshot.Device(index=device.index, uuid=None)
        try:
            if device.handle is None:
                raise GpuLost("NVML gave no handle for this GPU")
            _identify(device, out)
            fields = self._readings_of(device).read()
            for collector in self.collectors:
                store(collector.collect(device, fields), out)
        except GpuLost as e:
            out.lost, out.error = True, str(e)
            log.debug("GPU %d is lost: %s", device.index, e)
        self._remember(out)
        out.unsupported = device.refused_functions()
        return out

    def _readings_of(self, device: NvmlDevice) -> Readings:
        """The device's readings, wanting what the collectors want: the same for as long as the session lasts."""
        readings = self._readings.get(device)
        if readings is None:
            readings = Readings(device, self.session.driver_version)
            readings.wanted = frozenset(key for collector in self.collectors
                                        for key in collector.fields(device, readings.links))
            self._readings[device] = readings
        return readings

    def _remember(self, out: snapshot.Device) -> None:
        """A lost GPU keeps the identity and MIG mode it was last seen with, across NVML restarts
        too, so its health check, XID events and counts stay on the same series."""
        last = self._last_seen.get(out.index)
        if last is not None:
            for name in IDENTITY:
                if getattr(out, name) is None:
                    setattr(out, name, getattr(last, name))
        self._last_seen[out.index] = out


def _identify(device: NvmlDevice, out: snapshot.Device) -> None:
    """Each identity fact NVML gives. A lost GPU still gives those read earlier in this session (its
    UUID and bus ID when it was registered for events); the loss is raised after them."""
    lost = None
    for name in NVML_IDENTITY:
        try:
            setattr(out, name, getattr(device, name))
        except GpuLost as e:
            lost = lost or e
    if lost is not None:
        raise lost


def _users(devices: List[snapshot.Device]) -> FrozenSet[tuple]:
    """Which pod (or container) runs on which GPU: when this changes, pod-resources has news."""
    return frozenset((index, process.pod_uid or process.container_id) for index, process in _on_devices(devices))


def _processes(devices: List[snapshot.Device]) -> Iterator[snapshot.Process]:
    """Every process on the devices, their MIG instances' too."""
    return (process for _, process in _on_devices(devices))


def _on_devices(devices: List[snapshot.Device]) -> Iterator[Tuple[int, snapshot.Process]]:
    """(device index, process) of each process on a device or one of its MIG instances."""
    return (
        (device.index, process)
        for device in devices
        for target in (device, *device.mig_instances)
        for process in target.processes
    )
