"""The fault matrix: every fault, the same five promises.

Each case stages one fault on a real simulated node (the simulator's NVML, its HTTPS kubelet and
gRPC pod-resources socket, its proc root) or on a real local server written here (a kubelet that
answers 403, a sidecar on a unix socket), then runs the check RUNS times and asserts, run by run:

1. the run ends within its deadline (`DEADLINE` seconds of wall time);
2. `check.run()` returns "" (no exception escaped);
3. the named service check carries the fault: its status and a part of its message;
4. what the fault does not touch is intact (the case's `intact`, e.g. every other GPU's series);

and over the RUNS runs:

5. at most one WARNING-or-louder log line (the fault's one state change).

A case with `heal` then removes the fault and asserts the service check is OK again, what was
missing is back, and at most one WARNING-or-louder line more.

Some faults need the simulated driver to answer a code the simulator has no fault kind for
(DRIVER_NOT_LOADED from nvmlInit, NO_PERMISSION, a failing event registration). For those the
test replaces that one C entry point of the simulated libnvidia-ml with a ctypes function of the
same prototype that answers the code (or calls the simulator's own entry point): pynvml and the
check run unmodified, as they would against a driver that answers so.
"""

import copy
import json
import logging
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pynvml
import pytest
import yaml
from datadog_checks.base import AgentCheck
from datadog_checks.base.stubs import aggregator as _aggregator

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.collectors.node_reader import NodeReader
from gpu_monitoring.kube.pod_list import TERMINAL_PHASES
from gpu_monitoring.metrics.spec import SPEC
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.sidecar import protocol
from gpu_monitoring.simulator.abi import SYMBOLS, prototype
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.kubelet_server import KubeletServer
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.node import simulated_node
from gpu_monitoring.simulator.scenario import SCENARIO_DIR
from gpu_monitoring.simulator.scenario import load as load_scenario

from ..conftest import INTERVAL, SimulatedNode, tag_dict

OK, WARNING, CRITICAL = AgentCheck.OK, AgentCheck.WARNING, AgentCheck.CRITICAL
RUNS = 3
DEADLINE = 5.0
# Slow servers answer after SLOW seconds; the check is told to wait TIMEOUT.
TIMEOUT = 0.3
SLOW = 2.0
GPUS = set(range(8))
# Readings every healthy GPU of dgx-h100 submits, each from a different NVML query.
DEVICE_METRICS = ("utilization.gpu", "temperature", "memory.used", "power.usage", "clock.sm")
NVML_CHECK = "nvml.can_connect"
KUBELET_CHECK = "kubelet.can_connect"
SIDECAR_CHECK = "sidecar.can_connect"
HEALTH_CHECK = "device.health"
# Symbols that take no device handle: init, enumeration, versions, event sets (left to every driver here).
SYSTEM_SYMBOLS = {name for name, symbol in SYMBOLS.items() if not symbol.signature.startswith("h")}
DEVICE_SYMBOLS = sorted(set(SYMBOLS) - SYSTEM_SYMBOLS)
# What names a GPU (and so matches it to the kubelet's device IDs); every other device query reads something.
IDENTITY_SYMBOLS = {"nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMinorNumber",
                    "nvmlDeviceGetArchitecture"}
READING_SYMBOLS = sorted(set(DEVICE_SYMBOLS) - IDENTITY_SYMBOLS)
PROCESS_SYMBOLS = sorted(name for name in DEVICE_SYMBOLS if "Process" in name)
DGX = yaml.safe_load((SCENARIO_DIR / "dgx-h100.yaml").read_text())
# The processes NVML lists on each GPU of dgx-h100.
PROCESS_COUNTS = {index: len(device.get("processes", [])) for index, device in enumerate(DGX["devices"])}
# The process a pod that failed left on a GPU given to no one: a zombie, that GPU's one WARNING.
FINISHED = {pid for pod in DGX["kubernetes"]["pods"] if pod.get("phase") in TERMINAL_PHASES
            for container in pod["containers"] for pid in container.get("processes", [])}
((ZOMBIE_GPU, ZOMBIE_PID),) = [(index, process["pid"]) for index, device in enumerate(DGX["devices"])
                               for process in device.get("processes", []) if process["pid"] in FINISHED]


# --- the subjects: a check and what the last run submitted -----------------------------------------


class PlainNode(SimulatedNode):
    """A check on no simulated node (a library path that does not exist, a sidecar): same readers."""

    def __init__(self, instance: Dict[str, Any]):  # not super().__init__: that would simulate a node
        self.check = GpuMonitoringCheck("gpu_monitoring", {}, [instance])
        self.sim = None
        self.runs = 0


def timed_run(subject: SimulatedNode) -> float:
    """One check run, scenario time one interval on (after the first); its wall time in seconds."""
    if subject.sim is not None and subject.runs:
        subject.sim.advance(INTERVAL)
    _aggregator.reset()
    started = time.monotonic()
    error = subject.check.run()
    elapsed = time.monotonic() - started
    subject.runs += 1
    assert error == "", f"run {subject.runs} let an exception escape: {error}"
    return elapsed


def service_check(name: str, gpu: Optional[int] = None):
    """The one `gpu_monitoring.<name>` service check of the last run (of GPU `gpu` for device.health)."""
    found = [
        stub for stub in _aggregator.service_checks("gpu_monitoring." + name)
        if gpu is None or tag_dict(stub.tags).get("gpu_index") == str(gpu)
    ]
    assert len(found) == 1, f"expected one {name} service check{'' if gpu is None else f' for GPU {gpu}'}: {found}"
    return found[0]


def submitted_series() -> List[str]:
    return [name for name in _aggregator.metric_names if name.startswith("gpu_monitoring.")]


def loud(caplog) -> List[str]:
    return [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]


# --- what faults must leave alone ---------------------------------------------------------------------


def devices_intact(gpus=GPUS, metrics=DEVICE_METRICS, healthy=None, zombie_seen=True):
    """Every reading of `gpus` is submitted (and no other GPU's), NVML answers (what it cannot give
    is another matter), each (`healthy`) GPU is OK but the zombie's. That one is WARNING, naming the
    zombie, where the fault leaves the check what it needs to call it one (`zombie_seen`: NVML lists
    the process, /proc ties it to its pod, the kubelet says the pod failed), and OK where it does not."""

    def check(subject: SimulatedNode) -> None:
        for metric in metrics:
            assert set(subject.values(metric)) == set(gpus), metric
        assert service_check(NVML_CHECK).status != CRITICAL
        for gpu in gpus if healthy is None else healthy:
            stub = service_check(HEALTH_CHECK, gpu)
            if gpu == ZOMBIE_GPU and zombie_seen:
                assert stub.status == WARNING and f"pid {ZOMBIE_PID} " in stub.message, stub.message
            else:
                assert stub.status == OK, stub.message

    return check


def pods_named(subject: SimulatedNode) -> None:
    """GPU 0's series still name the pod that holds it (from whichever kubelet source still answers)."""
    (stub,) = [s for s in subject.series("utilization.gpu") if tag_dict(s.tags)["gpu_index"] == "0"]
    assert tag_dict(stub.tags).get("pod_name") == "llm-pretrain-0", stub.tags


def kubernetes_intact(subject: SimulatedNode) -> None:
    """Only Kubernetes failed: every device series of the eight GPUs is there, and their pods named."""
    devices_intact()(subject)
    pods_named(subject)


def kubelet_intact(subject: SimulatedNode) -> None:
    """Only the kubelet failed: as kubernetes_intact, but no pod's phase is known, so the failed pod's
    process is only a container's process on a GPU nobody was given: its GPU is OK."""
    devices_intact(zombie_seen=False)(subject)
    pods_named(subject)


def kubelet_ok(subject: SimulatedNode) -> None:
    check = service_check(KUBELET_CHECK)
    assert check.status == OK, check.message


NODE_SCOPES = ("node", "port")


def nothing_submitted(subject: SimulatedNode) -> None:
    """No GPU could be read: nothing stale or made up is passed off as this run's reading. The node's
    own series, read from sysfs this run, still go."""
    readings = [name for name in submitted_series() if SPEC[name[len("gpu_monitoring."):]].scope not in NODE_SCOPES]
    assert readings == []
    assert _aggregator.service_checks("gpu_monitoring." + HEALTH_CHECK) == []


def all_of(*checks: Callable) -> Callable:
    def check(subject: SimulatedNode) -> None:
        for one in checks:
            one(subject)

    return check


# --- staging faults --------------------------------------------------------------------------------


@dataclass
class Env:
    """What a case builds its fault with."""

    node: Callable[..., SimulatedNode]  # conftest's node(scenario, **options)
    plain: Callable[[Dict[str, Any]], SimulatedNode]
    tmp_path: Path
    cleanup: List[Callable[[], None]]
    sidecar_snapshot: Dict[str, Any]

    def scenario(self, faults=(), unsupported: Optional[Dict[int, List[str]]] = None,
                 missing: Optional[List[str]] = None) -> str:
        """dgx-h100 (eight H100, six pods, a kubelet) with a timeline of faults and refused functions."""
        raw = copy.deepcopy(DGX)
        raw["faults"] = list(faults)
        for index, names in (unsupported or {}).items():
            raw["devices"][index]["unsupported"] = list(names)
        if missing:
            raw["missing_functions"] = list(missing)
        path = self.tmp_path / "dgx-h100-faults.yaml"
        path.write_text(yaml.safe_dump(raw))
        return str(path)

    def kubernetes_node(self) -> Dict[str, Any]:
        """The kubelet options of a simulated dgx-h100 node whose NVML no check reads."""
        standing_in = simulated_node("dgx-h100")
        options = standing_in.start()
        self.cleanup.append(standing_in.stop)
        return options


class Script:
    """Scripted answers of simulated driver entry points: while `failing`, `name` answers `code`;
    `refusals` counts the answers it gave in place of the simulator."""

    def __init__(self, subject: SimulatedNode):
        self.library = subject.sim.library
        self.failing = True
        self.refusals: Dict[str, int] = {}

    def answer(self, name: str, code: int, only: Callable[..., bool] = lambda *args: True) -> "Script":
        original = getattr(self.library, name)

        def entry(*args):
            if self.failing and only(*args):
                self.refusals[name] = self.refusals.get(name, 0) + 1
                return code
            return original(*args)

        # Set before the first run: NvmlSession.start() clears pynvml's cache of looked-up symbols.
        setattr(self.library, name, prototype(SYMBOLS[name])(entry))
        return self


@dataclass
class Case:
    id: str
    build: Callable[[Env], SimulatedNode]
    check: str  # the service check that must carry the fault
    status: int
    says: Optional[str]  # a part of its message; None: no message
    intact: Callable[[SimulatedNode], None]
    gpu: Optional[int] = None  # for device.health
    warmup: int = 0  # healthy runs before the fault is injected
    inject: Optional[Callable[[SimulatedNode], None]] = None
    heal: Optional[Callable[[SimulatedNode], None]] = None
    healed: Callable[[SimulatedNode], None] = lambda subject: None
    heal_runs: int = 1


def dgx(env: Env) -> SimulatedNode:
    return env.node("dgx-h100")


# NVML ---------------------------------------------------------------------------------------------


def nvml_missing(env: Env) -> SimulatedNode:
    options = env.kubernetes_node()
    return env.plain({
        "nvml_library_path": str(env.tmp_path / "no-driver" / "libnvidia-ml.so.1"),
        "kubernetes": True,
        "pod_cache_ttl": 0,
        **{k: options[k] for k in ("kubelet_url", "kubelet_token_path", "kubelet_ca_path", "pod_resources_socket",
                                   "proc_root")},
    })


def driver_not_loaded(env: Env) -> SimulatedNode:
    subject = env.node("dgx-h100", pod_cache_ttl=0)
    subject.script = Script(subject).answer("nvmlInitWithFlags", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    return subject


def stop_failing(subject: SimulatedNode) -> None:
    subject.script.failing = False


def refused(name: str, at_least: int) -> Callable[[SimulatedNode], None]:
    """The scripted fault was met: `name` answered the fault's code at least `at_least` times so far."""

    def check(subject: SimulatedNode) -> None:
        assert subject.script.refusals.get(name, 0) >= at_least * subject.runs, subject.script.refusals

    return check


def driver_reload(env: Env) -> SimulatedNode:
    # Runs at t=0, 15, 30: the driver is reloaded at t=20 (every call UNINITIALIZED until nvmlInit);
    # XID 48 on GPU 0 at t=35 comes after it, to the event set registered again.
    return env.node(env.scenario([{"at": 20, "kind": "driver_reload"},
                                  {"at": 35, "kind": "xid", "device": 0, "xid": 48}]))


def xid_seen_once(gpu: int, xid: int) -> Callable[[SimulatedNode], None]:
    def check(subject: SimulatedNode) -> None:
        events = [(tag_dict(e["tags"])["gpu_index"], tag_dict(e["tags"])["xid"]) for e in _aggregator.events]
        assert events == [(str(gpu), str(xid))], events
        counts = {(tag_dict(s.tags)["gpu_index"], tag_dict(s.tags)["xid"]): s.value
                  for s in subject.series("xid_errors")}
        assert counts == {(str(gpu), str(xid)): 1}, counts

    return check


def gpu_lost(env: Env) -> SimulatedNode:
    # GPU 3 answers GPU_IS_LOST from t=5 (after the warm-up run at t=0) to t=50 (before the heal run at t=60).
    return env.node(env.scenario([{"at": 5, "kind": "gpu_lost", "device": 3, "duration": 45}]))


def one_gpu_refuses(symbols: List[str]) -> Callable[[Env], SimulatedNode]:
    """GPU 5 answers NOT_SUPPORTED to each of `symbols`."""
    return lambda env: env.node(env.scenario(unsupported={5: symbols}))


def driver_lacks(symbols: List[str]) -> Callable[[Env], SimulatedNode]:
    """The driver has none of `symbols` (pynvml: FUNCTION_NOT_FOUND), as legacy-driver lacks newer ones."""
    return lambda env: env.node(env.scenario(missing=symbols))


def still_counted(subject: SimulatedNode) -> None:
    _aggregator.assert_metric("gpu_monitoring.devices.count", value=8)
    assert service_check(NVML_CHECK).status == OK


def refused_gpu_is_read_nowhere_else(subject: SimulatedNode) -> None:
    assert 5 not in subject.values("utilization.gpu")
    assert service_check(HEALTH_CHECK, 5).status == OK, service_check(HEALTH_CHECK, 5).message


def every_gpu_healthy(subject: SimulatedNode) -> None:
    # The zombie's GPU too: a driver without the process queries lists no process to call one.
    for gpu in GPUS:
        assert service_check(HEALTH_CHECK, gpu).status == OK, service_check(HEALTH_CHECK, gpu).message


def no_permission(env: Env) -> SimulatedNode:
    # The process queries answer NO_PERMISSION on every GPU (an Agent without the rights to list them).
    subject = env.node("dgx-h100")
    subject.script = Script(subject)
    for name in PROCESS_SYMBOLS:
        subject.script.answer(name, pynvml.NVML_ERROR_NO_PERMISSION)
    return subject


def no_process_series(subject: SimulatedNode) -> None:
    assert subject.series("process.memory.used") == []


def registration_fails(env: Env) -> SimulatedNode:
    # nvmlDeviceRegisterEvents fails (UNKNOWN) for the runs at t=0, 15, 30; registration works again
    # from the run at t=45, and XID 48 on GPU 0 at t=50 is counted by the run at t=60.
    subject = env.node(env.scenario([{"at": 50, "kind": "xid", "device": 0, "xid": 48}]))
    subject.script = Script(subject).answer("nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_UNKNOWN)
    return subject


# kubelet ------------------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kubelet(behaviour: str, **options) -> Callable[[Env], SimulatedNode]:
    def build(env: Env) -> SimulatedNode:
        dgx = env.node("dgx-h100", pod_cache_ttl=0, **options)
        server = dgx.check.simulated_node.kubelet
        server.behaviour, server.delay = behaviour, SLOW
        return dgx

    return build


def kubelet_ok_again(subject: SimulatedNode) -> None:
    subject.check.simulated_node.kubelet.behaviour = "ok"


class ForbiddingKubelet(KubeletServer):
    """A kubelet whose RBAC does not let the service account read pods."""

    def _answer(self, path, authorization):
        with self._lock:
            self.requests += 1
        return 403, b"Forbidden (user=system:serviceaccount:datadog:datadog-agent, verb=get, resource=nodes)"


def kubelet_403(env: Env) -> SimulatedNode:
    server = ForbiddingKubelet(directory=str(env.tmp_path / "forbidding-kubelet")).start()
    env.cleanup.append(server.stop)
    return env.node("dgx-h100", pod_cache_ttl=0, kubelet_url=server.url, kubelet_token_path=server.token_path,
                    kubelet_ca_path=server.ca_path)


def kubelet_wrong_ca(env: Env) -> SimulatedNode:
    # Another kubelet's CA, made by the same helper: it did not sign this kubelet's certificate.
    other = KubeletServer(directory=str(env.tmp_path / "other-kubelet")).start()
    other.stop()
    return env.node("dgx-h100", pod_cache_ttl=0, kubelet_ca_path=other.ca_path)


def kubelet_refused(env: Env) -> SimulatedNode:
    return env.node("dgx-h100", pod_cache_ttl=0, kubelet_url=f"https://127.0.0.1:{closed_port()}/pods")


# pod-resources ------------------------------------------------------------------------------------


def pod_resources(behaviour: str) -> Callable[[Env], SimulatedNode]:
    def build(env: Env) -> SimulatedNode:
        dgx = env.node("dgx-h100")
        server = dgx.check.simulated_node.pod_resources
        server.delay = SLOW
        server.set_behaviour(behaviour)
        # No instance option sets the pod-resources deadline (5 s): a silent socket would hold each
        # run for 5 s, past this matrix's budget, so the reader is given the kubelet cases' deadline.
        dgx.check.pods.allocations.timeout = TIMEOUT
        return dgx

    return build


def pod_resources_ok_again(subject: SimulatedNode) -> None:
    subject.check.simulated_node.pod_resources.set_behaviour("ok")


def pod_resources_missing(env: Env) -> SimulatedNode:
    return env.node("dgx-h100", pod_resources_socket=str(env.tmp_path / "no-kubelet" / "kubelet.sock"))


# sidecar ------------------------------------------------------------------------------------------


class FakeSidecar:
    """The sidecar's API on a unix socket, answering from one snapshot; or broken on purpose:
    `cut` answers its headers and a little of the body, then closes (killed mid-response);
    `future` answers everything as API version 99."""

    def __init__(self, path: str, snapshot: Dict[str, Any]):
        self.path = path
        self.snapshot = snapshot
        self.mode = "ok"
        self._listener: Optional[socket.socket] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "FakeSidecar":
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(8)
        self._thread = threading.Thread(target=self._serve, args=(self._listener,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(), which close() alone does not
            self._listener.close()
            self._thread.join(timeout=5)
            Path(self.path).unlink(missing_ok=True)
            self._listener = None

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # closed by stop()
            with connection:
                connection.settimeout(5)
                try:
                    self._answer(connection)
                except OSError:
                    pass

    def _answer(self, connection: socket.socket) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = connection.recv(4096)
            if not chunk:
                return
            request += chunk
        path = request.split(b" ", 2)[1].decode()
        version = 99 if self.mode == "future" else protocol.API_VERSION
        if path.startswith(protocol.SNAPSHOT_PATH):
            body = {"snapshot": self.snapshot}
        elif path.startswith(protocol.EVENTS_PATH):
            body = {"events": [], "last_seq": 0, "first_seq": 1, "lost": False, "epoch": "fault-matrix"}
        else:
            body = {"status": "ok", "events": "ok", "journal": "ok", "last_seq": 0, "epoch": "fault-matrix"}
        data = json.dumps(dict(body, api_version=version)).encode()
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                "Connection: close\r\n\r\n").encode()
        if self.mode == "cut":
            connection.sendall(head + data[:20])
            return
        connection.sendall(head + data)


@pytest.fixture(scope="module")
def sidecar_snapshot(tmp_path_factory) -> Dict[str, Any]:
    """What a sidecar on a legacy-driver node (two GPUs) serves, read once by the sidecar's node reader."""
    nvml = SimulatedNvml(load_scenario("legacy-driver"), SimClock(speed=0))
    reader = NodeReader(NvmlSession(nvml.library), proc_root=str(tmp_path_factory.mktemp("proc")),
                              watch_events=False)
    try:
        return reader.read().to_dict()
    finally:
        reader.close()


def sidecar(mode: str) -> Callable[[Env], SimulatedNode]:
    def build(env: Env) -> SimulatedNode:
        path = str(env.tmp_path / "sidecar.sock")
        assert len(path.encode()) <= 107, path
        server = FakeSidecar(path, env.sidecar_snapshot).start()
        env.cleanup.append(server.stop)
        subject = env.plain({"source": "sidecar", "sidecar_socket": path, "kubernetes": False})
        subject.sidecar = server
        subject.fault = mode
        return subject

    return build


def break_sidecar(subject: SimulatedNode) -> None:
    if subject.fault == "down":
        subject.sidecar.stop()
    else:
        subject.sidecar.mode = subject.fault


def mend_sidecar(subject: SimulatedNode) -> None:
    if subject.fault == "down":
        subject.sidecar.start()
    subject.sidecar.mode = "ok"


def sidecar_series(subject: SimulatedNode) -> None:
    for metric in DEVICE_METRICS[:3]:
        assert set(subject.values(metric)) == {0, 1}, metric
    assert service_check(NVML_CHECK).status == OK


# /proc --------------------------------------------------------------------------------------------


def remove_pid_dirs(subject: SimulatedNode) -> None:
    root = Path(subject.check.derived.proc_root)
    pids = [p for p in root.iterdir() if p.name.isdigit()]
    assert pids
    for pid in pids:
        shutil.rmtree(pid)


def remove_proc_root(subject: SimulatedNode) -> None:
    shutil.rmtree(subject.check.derived.proc_root)


def processes_still_listed(subject: SimulatedNode) -> None:
    # NVML still lists every process: each is counted on its GPU, only the /proc details are gone.
    assert subject.values("processes.count") == PROCESS_COUNTS


# --- the matrix ------------------------------------------------------------------------------------

# Bugs the matrix shows (strict xfails: fix the bug and the case passes, and must lose its mark).
CASES = [
    # NVML
    Case("nvml-missing", nvml_missing, NVML_CHECK, CRITICAL, "could not load nvml_library_path",
         all_of(nothing_submitted, kubelet_ok)),
    Case("driver-not-loaded-then-loaded", driver_not_loaded, NVML_CHECK, CRITICAL, "Driver Not Loaded",
         all_of(nothing_submitted, kubelet_ok, refused("nvmlInitWithFlags", 1)),
         heal=stop_failing, healed=all_of(devices_intact(), pods_named)),
    Case("driver-reloaded", driver_reload, NVML_CHECK, OK, None, devices_intact(),
         heal=lambda subject: None, healed=all_of(devices_intact(healthy=GPUS - {0}), xid_seen_once(0, 48))),
    Case("gpu-is-lost-on-one-of-eight", gpu_lost, HEALTH_CHECK, CRITICAL, "GPU lost",
         all_of(devices_intact(GPUS - {3}), kubelet_ok, still_counted), gpu=3, warmup=1,
         heal=lambda subject: None, healed=devices_intact()),
    Case("one-gpu-refuses-every-reading", one_gpu_refuses(READING_SYMBOLS), NVML_CHECK, OK, None,
         all_of(devices_intact(GPUS - {5}), refused_gpu_is_read_nowhere_else, still_counted, kubelet_ok)),
    Case("one-gpu-refuses-every-function", one_gpu_refuses(DEVICE_SYMBOLS), NVML_CHECK, OK, None,
         all_of(devices_intact(GPUS - {5}), refused_gpu_is_read_nowhere_else, still_counted, kubelet_ok)),
    Case("driver-lacks-every-reading", driver_lacks(READING_SYMBOLS), NVML_CHECK, OK, None,
         all_of(still_counted, every_gpu_healthy, kubelet_ok)),
    Case("driver-lacks-every-device-function", driver_lacks(DEVICE_SYMBOLS), NVML_CHECK, OK, None,
         all_of(still_counted, kubelet_ok)),
    # Refused once, then remembered (no count); no process listed, so no zombie either.
    Case("no-permission-for-processes", no_permission, NVML_CHECK, WARNING, "no permission",
         all_of(devices_intact(zombie_seen=False), no_process_series, kubelet_ok)),
    Case("event-registration-fails-then-works", registration_fails, NVML_CHECK, WARNING, "events are not watched",
         all_of(devices_intact(), kubelet_ok, refused("nvmlDeviceRegisterEvents", len(GPUS))),
         heal=stop_failing, heal_runs=2, healed=all_of(devices_intact(healthy=GPUS - {0}), xid_seen_once(0, 48))),
    # kubelet
    Case("kubelet-refused", kubelet_refused, KUBELET_CHECK, WARNING, "cannot connect to the kubelet",
         kubelet_intact),
    Case("kubelet-401", kubelet("unauthorized"), KUBELET_CHECK, CRITICAL, "(HTTP 401)", kubelet_intact,
         heal=kubelet_ok_again, healed=kubernetes_intact),
    Case("kubelet-403", kubelet_403, KUBELET_CHECK, CRITICAL, "(HTTP 403)", kubelet_intact),
    Case("kubelet-500", kubelet("error"), KUBELET_CHECK, WARNING, "HTTP 500", kubelet_intact,
         heal=kubelet_ok_again, healed=kubernetes_intact),
    Case("kubelet-slow", kubelet("slow", kubelet_timeout=TIMEOUT), KUBELET_CHECK, WARNING,
         "did not answer in time", kubelet_intact, heal=kubelet_ok_again, healed=kubernetes_intact),
    Case("kubelet-wrong-ca", kubelet_wrong_ca, KUBELET_CHECK, CRITICAL, "TLS verification", kubelet_intact),
    Case("kubelet-garbage", kubelet("garbage"), KUBELET_CHECK, CRITICAL, "did not send a valid pod list",
         kubelet_intact, heal=kubelet_ok_again, healed=kubernetes_intact),
    # pod-resources
    Case("pod-resources-missing", pod_resources_missing, KUBELET_CHECK, WARNING, "does not exist",
         kubernetes_intact),
    Case("pod-resources-unimplemented", pod_resources("unimplemented"), KUBELET_CHECK, WARNING,
         "does not serve v1 PodResourcesLister/List", kubernetes_intact,
         heal=pod_resources_ok_again, healed=kubernetes_intact),
    Case("pod-resources-silent", pod_resources("slow"), KUBELET_CHECK, WARNING, f"did not answer within {TIMEOUT:g}s",
         kubernetes_intact, heal=pod_resources_ok_again, healed=kubernetes_intact),
    Case("pod-resources-garbage", pod_resources("garbage"), KUBELET_CHECK, WARNING, "undecodable",
         kubernetes_intact, heal=pod_resources_ok_again, healed=kubernetes_intact),
    Case("pod-resources-rate-limited", pod_resources("rate_limited"), KUBELET_CHECK, WARNING, "rate-limiting",
         kubernetes_intact, heal=pod_resources_ok_again, healed=kubernetes_intact),
    # sidecar
    Case("sidecar-down", sidecar("down"), SIDECAR_CHECK, CRITICAL, "no sidecar socket", nothing_submitted,
         warmup=1, inject=break_sidecar, heal=mend_sidecar, healed=sidecar_series),
    Case("sidecar-killed-mid-response", sidecar("cut"), SIDECAR_CHECK, CRITICAL, "closed the connection",
         nothing_submitted,
         warmup=1, inject=break_sidecar, heal=mend_sidecar, healed=sidecar_series),
    Case("sidecar-wrong-api-version", sidecar("future"), SIDECAR_CHECK, CRITICAL, "speaks API version 99",
         nothing_submitted, warmup=1, inject=break_sidecar, heal=mend_sidecar, healed=sidecar_series),
    # /proc
    Case("proc-pid-dirs-vanish", dgx, KUBELET_CHECK, OK, None,
         all_of(devices_intact(zombie_seen=False), processes_still_listed), warmup=1, inject=remove_pid_dirs),
    Case("proc-root-vanishes", dgx, KUBELET_CHECK, OK, None,
         all_of(devices_intact(zombie_seen=False), processes_still_listed), warmup=1, inject=remove_proc_root),
]


@pytest.fixture
def env(node, tmp_path, sidecar_snapshot, datadog_agent):
    """`datadog_agent`: the sidecar cases' event cursors live in its persistent cache, reset around each case."""
    made: List[SimulatedNode] = []
    cleanup: List[Callable[[], None]] = []

    def plain(instance: Dict[str, Any]) -> SimulatedNode:
        made.append(PlainNode(instance))
        return made[-1]

    yield Env(node=node, plain=plain, tmp_path=tmp_path, cleanup=cleanup, sidecar_snapshot=sidecar_snapshot)
    for subject in made:
        subject.check.cancel()
    for step in reversed(cleanup):
        step()


def assert_carries(case: Case, status: int, says: Optional[str]) -> None:
    stub = service_check(case.check, case.gpu)
    assert stub.status == status, f"{case.check}: status {stub.status}, message {stub.message!r}"
    if says is None:
        assert not stub.message, stub.message
    else:
        assert says in (stub.message or ""), stub.message


@pytest.mark.parametrize("case", CASES, ids=[(c if isinstance(c, Case) else c.values[0]).id for c in CASES])
def test_fault(case: Case, env: Env, caplog):
    subject = case.build(env)
    for _ in range(case.warmup):
        assert timed_run(subject) < DEADLINE
        assert_carries(case, OK, None)
    if case.inject:
        case.inject(subject)
    caplog.clear()
    caplog.set_level(logging.INFO)
    for run in range(RUNS):
        elapsed = timed_run(subject)
        assert elapsed < DEADLINE, f"run {run + 1} took {elapsed:.1f}s"
        assert_carries(case, case.status, case.says)
        case.intact(subject)
    assert len(loud(caplog)) <= 1, loud(caplog)
    if case.heal is None:
        return
    caplog.clear()
    case.heal(subject)
    for _ in range(case.heal_runs):
        assert timed_run(subject) < DEADLINE
    assert_carries(case, OK, None)
    case.healed(subject)
    assert len(loud(caplog)) <= 1, loud(caplog)


# --- faults no service check tells ----------------------------------------------------------------

@pytest.mark.parametrize("build, word", [
    pytest.param(registration_fails, "event", id="event-registration-fails"),
    pytest.param(no_permission, "permission", id="no-permission-for-processes"),
])
def test_a_service_check_names_the_fault(build, word, env, caplog):
    caplog.set_level(logging.INFO)
    subject = build(env)
    assert timed_run(subject) < DEADLINE
    messages = [stub.message or "" for name in _aggregator.service_check_names
                for stub in _aggregator.service_checks(name)]
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert any(word in m.lower() for m in messages), messages
    assert any(word in m.lower() for m in logged), logged


def test_a_sidecar_killed_mid_answer_is_told_from_a_wrong_one(env):
    subject = sidecar("cut")(env)
    break_sidecar(subject)
    assert timed_run(subject) < DEADLINE
    message = service_check(SIDECAR_CHECK).message
    assert "not JSON" not in message, message
    assert any(word in message for word in ("incomplete", "truncated", "ended", "closed", "cut")), message
