"""NVIDIA's dcgm-exporter over real HTTP on 127.0.0.1, as the GPU Operator runs it on every GPU node.

`GET /metrics` answers the Prometheus text format dcgm-exporter writes (its
internal/pkg/rendermetrics/render_metrics.go): for each counter `# HELP` and `# TYPE`, then a line
per GPU, or per GPU instance of a GPU in MIG mode (dcgm-exporter's default `-d f` watches the
instances in place of such a GPU), with its labels in dcgm-exporter's order:

    DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-...",pci_bus_id="00000000:07:00.0",device="nvidia0",
        modelName="NVIDIA A100-SXM4-80GB",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-1",
        DCGM_FI_DRIVER_VERSION="535.183.01",container="trainer",namespace="ml",pod="train-large"} 0.718843

`UUID` is the GPU's (the parent's for an instance); `Hostname` became `hostname` in dcgm-exporter's
May 2026 release (pull request 655), a scenario chooses which; `container`, `namespace` and `pod`
name the pod that holds the GPU or instance (its pod mapper keeps one per device). No sample
carries a timestamp; integers print as integers, doubles with six decimals (its toString). A field
DCGM leaves blank for an entity (utilization on a MIG instance, memory temperature on a T4) has no
line, as dcgm-exporter skips blank values.

The counters are those of dcgm-exporter's etc/default-counters.csv (NVIDIA/dcgm-exporter, 2026),
in its order; `counters: profiling` also turns on the lines it leaves commented out (SM active and
occupancy, the FP64/FP32/FP16 pipes) and the NVLink bytes of DCGM's profiling module. The values
come from the simulated GPUs: the profiling ratios from the same load curve and shares GPM
reports (SimDevice.profile), averaged over DCGM's last sample period, so DCGM's SM active for a
GPU is what GPM would say over that period. DCGM samples every `interval` seconds: every value
is the one of the last sample time, and changes only when the next is due.

`behaviour` makes it misbehave on purpose: `ok`, `garbage` (200 with a body that is not the
format), `slow` (answers after `delay` seconds), `error` (500), `stale` (DCGM stopped sampling:
the values of the sample time when it was set, for ever).
"""

import math
import socket
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

from gpu_monitoring.health.xid import describe
from gpu_monitoring.simulator.device_model import MIB, SimDevice, SimMigInstance
from gpu_monitoring.simulator.http_server import ThreadedServer
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import DcgmExporterSpec

BEHAVIOURS = ("ok", "garbage", "slow", "error", "stale")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Value = Union[int, float]
Holder = Tuple[str, str, str]  # namespace, pod, container
EntityKey = Tuple[int, Optional[int]]  # (GPU index, GPU instance ID or None)


@dataclass(frozen=True)
class Counter:
    field: str
    kind: str  # gauge | counter, as the CSV declares
    help: str


# etc/default-counters.csv, each line not commented out, in the file's order (DCGM_FI_DRIVER_VERSION
# there is a label of every line, not a counter).
DEFAULT_COUNTERS = [
    Counter("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    Counter("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    Counter("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    Counter("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    Counter("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    Counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    Counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    Counter("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    Counter("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    Counter("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    Counter("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    Counter("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    Counter("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    Counter("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    Counter("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    Counter("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "NVLink bandwidth counters for all lanes."),
    Counter("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    Counter("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    Counter("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    Counter("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    Counter("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    Counter("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    Counter("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
            "Ratio of cycles the device memory interface is active sending or receiving data."),
    Counter("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "PCIe bytes transmitted per second."),
    Counter("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "PCIe bytes received per second."),
]
# The profiling fields default-counters.csv leaves commented out, and DCGM's NVLink bytes
# (dcgm_fields.h: DCGM_FI_PROF_NVLINK_TX_BYTES, _RX_BYTES).
PROFILING_COUNTERS = [
    Counter("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    Counter("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM."),
    Counter("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active."),
    Counter("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active."),
    Counter("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active."),
    Counter("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "NVLink bytes transmitted per second."),
    Counter("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "NVLink bytes received per second."),
]
# The ratios of DCGM's profiling module (0-1, doubles), by SimDevice.profile's key.
PROFILE_RATIOS = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "graphics",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram",
    "DCGM_FI_PROF_SM_ACTIVE": "sm",
    "DCGM_FI_PROF_SM_OCCUPANCY": "occupancy",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "fp64",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "fp32",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "fp16",
}
# Whole-GPU fields DCGM leaves blank for a GPU instance.
NOT_ON_INSTANCES = {
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES",
}


def counters_of(spec: DcgmExporterSpec) -> List[Counter]:
    return DEFAULT_COUNTERS + (PROFILING_COUNTERS if spec.profiling else [])


@dataclass
class Entity:
    """What dcgm-exporter watches: a GPU, or a GPU instance of one in MIG mode."""

    device: SimDevice
    instance: Optional[SimMigInstance] = None
    holder: Optional[Holder] = None

    @property
    def key(self) -> EntityKey:
        return self.device.index, self.instance.spec.gpu_instance_id if self.instance else None


def entities(nvml: SimulatedNvml, holders: Mapping[EntityKey, Holder]) -> List[Entity]:
    found = [Entity(d, i) for d in nvml.devices for i in (d.mig or [None])]
    for entity in found:
        entity.holder = holders.get(entity.key)
    return found


def sample_time(now: float, interval: float) -> float:
    """The time of DCGM's last sample: values change only when the next one is due."""
    return math.floor(now / interval) * interval


def values(entity: Entity, t: float, interval: float) -> Dict[str, Value]:
    """Every field DCGM has a value for on the entity at sample time t; none for a lost GPU."""
    device, instance = entity.device, entity.instance
    if device.lost(t):
        return {}
    found = dict(_device_fields(device, t), **_memory_fields(device, instance, t))
    found.update(_rates(device, max(0.0, t - interval), t))
    profile = device.profile(instance.load if instance else device.load, max(0.0, t - interval), t)
    found.update({name: profile[key] / 100 for name, key in PROFILE_RATIOS.items()})
    if instance is not None:
        found = {name: value for name, value in found.items() if name not in NOT_ON_INSTANCES}
    return found


def _device_fields(device: SimDevice, t: float) -> Dict[str, Value]:
    spec, counters, util = device.spec, device.counters(t), device.utilization(t)
    found: Dict[str, Value] = {
        "DCGM_FI_DEV_SM_CLOCK": device.clock("sm", t),
        "DCGM_FI_DEV_MEM_CLOCK": device.clock("memory", t),
        "DCGM_FI_DEV_GPU_TEMP": device.temperature(t),
        "DCGM_FI_DEV_POWER_USAGE": device.power_mw(t) / 1000,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": int(counters["pcie_replay"]),
        "DCGM_FI_DEV_GPU_UTIL": int(round(util)),
        "DCGM_FI_DEV_MEM_COPY_UTIL": int(round(util * spec.load.get("memory_bandwidth_share", 0.55))),
        "DCGM_FI_DEV_XID_ERRORS": _last_xid(device, t),
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": int(counters.get("nvlink_tx_kib", 0) + counters.get("nvlink_rx_kib", 0)),
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
    }
    if spec.get("memory_temperature"):
        found["DCGM_FI_DEV_MEMORY_TEMP"] = device.memory_temperature(t)
    if spec.get("energy"):
        found["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = int(counters["energy_mj"])
    for field, key in (("DCGM_FI_DEV_ENC_UTIL", "encoder"), ("DCGM_FI_DEV_DEC_UTIL", "decoder")):
        if key in spec.load:
            found[field] = int(spec.load[key] * util / 100)
    if spec.get("row_remapping"):
        found.update({
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": int(counters["remap_unc"]),
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": int(counters["remap_cor"]),
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": int(counters["remap_failure"]),
        })
    return found


def _memory_fields(device: SimDevice, instance: Optional[SimMigInstance], t: float) -> Dict[str, Value]:
    total, reserved, used = device.memory(t, instance)
    return {
        "DCGM_FI_DEV_FB_FREE": (total - reserved - used) // MIB,
        "DCGM_FI_DEV_FB_USED": used // MIB,
        "DCGM_FI_DEV_FB_RESERVED": reserved // MIB,
    }


def _rates(device: SimDevice, t1: float, t2: float) -> Dict[str, Value]:
    """PCIe and NVLink bytes per second over DCGM's sample period, from the simulator's counters."""
    if t2 <= t1:
        return {}
    before, after = device.counters(t1), device.counters(t2)

    def rate(key: str, scale: int = 1) -> int:
        return int((after.get(key, 0) - before.get(key, 0)) * scale / (t2 - t1))

    return {
        "DCGM_FI_PROF_PCIE_TX_BYTES": rate("pcie_tx_bytes"),
        "DCGM_FI_PROF_PCIE_RX_BYTES": rate("pcie_rx_bytes"),
        "DCGM_FI_PROF_NVLINK_TX_BYTES": rate("nvlink_tx_kib", 1024),
        "DCGM_FI_PROF_NVLINK_RX_BYTES": rate("nvlink_rx_kib", 1024),
    }


def _last_xid(device: SimDevice, t: float) -> int:
    fired = [f for f in device.faults if f.kind == "xid" and f.at <= t]
    return int(fired[-1].params.get("xid", 0)) if fired else 0


def page(nvml: SimulatedNvml, spec: DcgmExporterSpec, holders: Mapping[EntityKey, Holder], t: float) -> str:
    """dcgm-exporter's `/metrics` page at sample time t."""
    watched = entities(nvml, holders)
    sampled = [(entity, values(entity, t, spec.interval)) for entity in watched]
    labels = {entity.key: _labels(entity, spec, nvml) for entity in watched}
    lines: List[str] = []
    for counter in counters_of(spec):
        lines += [f"# HELP {counter.field} {counter.help}", f"# TYPE {counter.field} {counter.kind}"]
        for entity, found in sampled:
            if counter.field in found:
                value = found[counter.field]
                extra = _xid_labels(value) if counter.field == "DCGM_FI_DEV_XID_ERRORS" else {}
                lines.append(f"{counter.field}{{{_render(labels[entity.key], extra, entity.holder)}}} {_format(value)}")
    return "\n".join(lines) + "\n"


def _labels(entity: Entity, spec: DcgmExporterSpec, nvml: SimulatedNvml) -> Dict[str, str]:
    device = entity.device
    found = {
        "gpu": str(device.index),
        "UUID": device.spec.uuid,
        "pci_bus_id": device.spec.pci_bus_id,
        "device": f"nvidia{device.index}",
        "modelName": device.spec["name"],
    }
    if entity.instance is not None:
        found.update(GPU_I_PROFILE=entity.instance.spec.profile, GPU_I_ID=str(entity.instance.spec.gpu_instance_id))
    found[spec.hostname_label] = socket.gethostname()
    found["DCGM_FI_DRIVER_VERSION"] = str(nvml.scenario.driver["version"])
    return found


def _xid_labels(code: Value) -> Dict[str, str]:
    return {"err_code": str(code), "err_msg": describe(int(code)).meaning if code else "No Error"}


def _render(labels: Dict[str, str], extra: Dict[str, str], holder: Optional[Holder]) -> str:
    # The exporter's own labels, then its attributes in name order (Go's templates range over maps so).
    attributes = dict(extra)
    if holder is not None:
        attributes.update(namespace=holder[0], pod=holder[1], container=holder[2])
    pairs = list(labels.items()) + sorted(attributes.items())
    return ",".join(f'{name}="{_escaped(value)}"' for name, value in pairs)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format(value: Value) -> str:
    return f"{value:f}" if isinstance(value, float) else str(value)


class DcgmExporterServer(ThreadedServer):
    """dcgm-exporter's HTTP endpoint over a simulated node; use as a context manager or start() and stop()."""

    BEHAVIOURS = BEHAVIOURS
    thread_name = "dcgm-exporter"

    def __init__(self, nvml: SimulatedNvml, spec: DcgmExporterSpec, holders: Mapping[EntityKey, Holder] = (),
                 behaviour: str = "ok", delay: float = 1.0):
        self.nvml = nvml
        self.spec = spec
        self.holders = dict(holders)
        self.delay = delay
        self.requests = 0
        super().__init__(behaviour)

    def _behaviour_changed(self, value: str) -> None:
        # A stale exporter is one whose DCGM stopped sampling: its page keeps this sample's values.
        self._frozen_at = self.sample_time() if value == "stale" else None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def sample_time(self) -> float:
        return sample_time(self.nvml.now(), self.spec.interval)

    def start(self) -> "DcgmExporterServer":
        self._serve(_Server(("127.0.0.1", 0), _Handler, self))
        return self

    def __enter__(self) -> "DcgmExporterServer":
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()

    def answer(self, path: str) -> Tuple[int, bytes]:
        """(status, body) for one GET; counts it."""
        self.requests += 1
        route = path.split("?", 1)[0]
        if route == "/health":
            return 200, b"OK"
        if route != "/metrics":
            return 404, b"404 page not found"
        return _ANSWERS[self._behaviour](self)

    def _page(self) -> Tuple[int, bytes]:
        t = self._frozen_at if self._frozen_at is not None else self.sample_time()
        return 200, page(self.nvml, self.spec, self.holders, t).encode()

    def _slow(self) -> Tuple[int, bytes]:
        time.sleep(self.delay)
        return self._page()


_ANSWERS: Dict[str, Callable[[DcgmExporterServer], Tuple[int, bytes]]] = {
    "ok": DcgmExporterServer._page,
    "stale": DcgmExporterServer._page,
    "slow": DcgmExporterServer._slow,
    "garbage": lambda _server: (200, b"<html>\x00not { a metrics page"),
    "error": lambda _server: (500, b"internal error"),
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a request asleep in `slow` must not hold up stop()

    def __init__(self, address, handler, exporter: DcgmExporterServer):
        self.exporter = exporter
        super().__init__(address, handler)

    def handle_error(self, request, client_address) -> None:
        pass  # clients that hang up on a slow answer are expected


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "dcgm-exporter"
    protocol_version = "HTTP/1.1"  # keeps connections open between requests, as Go's net/http does

    def do_GET(self) -> None:
        status, body = self.server.exporter.answer(self.path)
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE if status == 200 else "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        pass  # quiet beside the demo's output
