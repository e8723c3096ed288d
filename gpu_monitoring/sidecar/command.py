"""`gpu-monitoring sidecar` and `gpu-monitoring healthz`."""

import argparse
import logging
import os
import sys
import time
from typing import Optional, Union
from urllib.parse import urlsplit

from gpu_monitoring.config.value_checks import MAX_SOCKET_PATH_BYTES
from gpu_monitoring.deps import MissingPackage, require
from gpu_monitoring.kube import DEFAULT_TTL
from gpu_monitoring.sidecar import protocol
from gpu_monitoring.sidecar.journal import JournalLockedError

DEFAULT_POD_RESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"


def add_parsers(commands) -> None:
    sidecar = commands.add_parser(
        "sidecar", help="serve NVML snapshots and events on a unix socket (one per node)",
        description="Own NVML on this GPU node, journal its XID and ECC events, and serve snapshots and the "
                    "journal to the gpu_monitoring check (source: sidecar) on a unix socket.")
    sidecar.add_argument("--socket", default=protocol.DEFAULT_SOCKET, metavar="PATH",
                         help="unix socket to serve, mode 0660 (default %(default)s)")
    sidecar.add_argument("--journal", default=protocol.DEFAULT_JOURNAL, metavar="DIR",
                         help="directory of the event journal (default %(default)s)")
    sidecar.add_argument("--proc-root", default="/proc", metavar="DIR",
                         help="where process names and cgroups are read (default %(default)s)")
    sidecar.add_argument("--sysfs-root", default="/sys", metavar="DIR",
                         help="where the kernel's sysfs is read: the NVIDIA functions on the PCI bus (GPUs the driver "
                              "or NVML misses) and the InfiniBand and RoCE ports (default %(default)s; in a container, "
                              "the host's /sys mounted read-only)")
    sidecar.add_argument("--pod-resources-socket", metavar="PATH",
                         help=f"the kubelet's pod-resources socket; connecting to it needs uid 0 (default "
                              f"{DEFAULT_POD_RESOURCES}, read in a pod or where it exists; with --simulate, the "
                              "simulated node's when its scenario has pods, otherwise only one given here)")
    sidecar.add_argument("--pod-cache-ttl", type=float, default=DEFAULT_TTL, metavar="SECONDS",
                         help="seconds a pod-resources answer is kept while the GPUs' processes keep their "
                              "containers; 0 asks for every snapshot (default %(default)g)")
    sidecar.add_argument("--dcgm-exporter-url", metavar="URL", type=_exporter_url,
                         help="read this node's dcgm-exporter (http://HOST:9400/metrics) with every snapshot and "
                              "serve DCGM's profiling activity for the GPUs GPM does not measure; the check then "
                              "reads it no more (default: not read here; the check reads it, finding it itself "
                              "on Kubernetes)")
    sidecar.add_argument("--nvml-library-path", metavar="PATH",
                         help="load this libnvidia-ml (default: the one the dynamic linker finds)")
    sidecar.add_argument("--simulate", metavar="SCENARIO",
                         help="serve a simulated node (scenario name or YAML path) instead of the driver's "
                              "(default: off)")
    sidecar.add_argument("--speed", type=float, default=1.0,
                         help="with --simulate: simulated seconds per real second (default %(default)g)")
    sidecar.add_argument("--start-at", type=float, default=0.0, metavar="SECONDS",
                         help="with --simulate: scenario time to start at, as after a restart (default %(default)g)")
    sidecar.add_argument("--journal-wait", type=float, default=30.0, metavar="SECONDS",
                         help="how long to wait for a journal another sidecar still holds (default %(default)g)")
    sidecar.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                         help="the least severe messages logged (default %(default)s)")
    healthz = commands.add_parser(
        "healthz", help="exit 0 when the sidecar on the socket is ready, 1 otherwise",
        description="Ask a sidecar for GET /healthz and print its state. Exit 0 when it is ready: it answers, "
                    "NVML can be read (the library loads, initialises and answers for at least one GPU) and its "
                    "journal can be written; exit 1 otherwise, saying why (the readiness probe). With --live, "
                    "exit 1 only when nothing answers (the liveness probe).")
    healthz.add_argument("--socket", default=protocol.DEFAULT_SOCKET, metavar="PATH",
                         help="the unix socket the sidecar serves, its --socket (default %(default)s)")
    healthz.add_argument("--live", action="store_true",
                         help="exit 0 whenever the sidecar answers, ready or not: a sidecar whose journal fails "
                              "holds its events in memory, and a restart would lose them (default: off)")


def run_sidecar(args: argparse.Namespace) -> int:
    try:
        require("pynvml")
    except MissingPackage as e:
        sys.stderr.write(f"gpu-monitoring sidecar: {e.package} is not installed: the sidecar needs the "
                         "package's `deps` extra (pip install 'datadog-gpu-monitoring[deps]')\n")
        return 2
    from gpu_monitoring.sidecar.app import Sidecar
    from gpu_monitoring.simulator import ScenarioError, SimClock
    from gpu_monitoring.simulator.node import simulated_node

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    too_long = _socket_too_long(args.socket)
    if too_long:
        sys.stderr.write(f"gpu-monitoring sidecar: cannot start: {too_long}\n")
        return 1
    requested = args.pod_resources_socket
    library, proc_root, sysfs_root, node = args.nvml_library_path, args.proc_root, args.sysfs_root, None
    pod_resources = requested or DEFAULT_POD_RESOURCES
    if args.simulate:
        try:
            node = simulated_node(args.simulate, SimClock(speed=args.speed, start=args.start_at))
        except ScenarioError as e:
            sys.stderr.write(f"gpu-monitoring sidecar: {e}\n")
            return 2
        options = node.start()
        library, proc_root, sysfs_root = node.nvml.library, options["proc_root"], options.get("sysfs_root", sysfs_root)
        # A scenario with pods serves its own pod-resources; one without reads only a socket given here.
        pod_resources = options.get("pod_resources_socket", requested)
    try:
        try:
            sidecar = Sidecar(args.socket, args.journal, library, proc_root, _existing(pod_resources),
                              journal_wait=args.journal_wait, pod_cache_ttl=args.pod_cache_ttl,
                              dcgm_exporter_url=args.dcgm_exporter_url, sysfs_root=sysfs_root,
                              clock=node.nvml.now if node is not None else time.time)
        except (OSError, JournalLockedError) as e:
            # Each of these is a deployment mistake the operator fixes from the message alone.
            sys.stderr.write(f"gpu-monitoring sidecar: cannot start: {_start_error(e, args)}\n")
            return 1
        sidecar.serve()
    finally:
        if node is not None:
            node.stop()
    return 0


def _exporter_url(value: str) -> str:
    # A URL only: `auto` (finding the exporter) takes the kubelet's pod list, which only the check reads.
    if urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname:
        raise argparse.ArgumentTypeError(f"an http or https URL of this node's dcgm-exporter /metrics, not {value!r}")
    return value


def _socket_too_long(path: str) -> Optional[str]:
    size = len(os.fsencode(path))
    if size <= MAX_SOCKET_PATH_BYTES:
        return None
    return f"--socket {path} is {size} bytes long; a unix socket path can have at most {MAX_SOCKET_PATH_BYTES}"


def _start_error(error: Union[OSError, JournalLockedError], args: argparse.Namespace) -> str:
    if isinstance(error, JournalLockedError):
        return f"{error}: is another sidecar running with --journal {args.journal}?"
    if error.strerror is None:  # raised with a message of its own, as server.SocketInUse is
        return str(error)
    if error.filename is None:  # bind() names no path; the journal's calls all do
        return f"cannot serve on --socket {args.socket}: {error.strerror}"
    # makedirs(exist_ok=True) fails with EEXIST only where the path is not a directory.
    reason = "exists and is not a directory" if isinstance(error, FileExistsError) else error.strerror
    journal = os.fspath(error.filename).startswith(args.journal)
    option = f"--journal {args.journal}" if journal else f"--socket {args.socket}"
    return f"{option}: {error.filename}: {reason}"


def _existing(path: Optional[str]) -> Optional[str]:
    """The pod-resources socket to read: in a pod always (a socket missing there is worth a
    warning), elsewhere only where the kubelet serves one."""
    if not path:
        return None
    return path if "KUBERNETES_SERVICE_HOST" in os.environ or os.path.exists(path) else None


def run_healthz(args: argparse.Namespace) -> int:
    from gpu_monitoring.sidecar.client import SidecarClient, SidecarUnavailable

    try:
        body = SidecarClient(args.socket, timeout=5).get(protocol.HEALTH_PATH)
    except SidecarUnavailable as e:
        sys.stderr.write(f"unhealthy: {e}\n")
        return 1
    print(_health_line(body))
    # A sidecar whose journal cannot be written holds its events in memory: restarting it (what a
    # failed liveness probe does) would lose them, so liveness asks only that it answers.
    return 0 if args.live or body.get("status") == "ok" else 1


def _health_line(body: dict) -> str:
    """`<status>: nvml ...; journal ...; events ...; last_seq N`: what readiness rests on first, and why it fails."""
    nvml, events = body.get("nvml"), body.get("events")
    parts = [_state("nvml", nvml), _state("journal", body.get("journal"))]
    if events == "ok" or events != nvml:  # NVML that cannot be read loses its events too: said once
        parts.append(_state("events", events))
    return f"{body.get('status')}: " + "; ".join(parts + [f"last_seq {body.get('last_seq')}"])


def _state(name: str, value: object) -> str:
    return f"{name} ok" if value == "ok" else f"{name}: {value}"
