"""`gpu-monitoring sidecar` and `gpu-monitoring healthz`."""

import argparse
import logging
import os
import sys
from typing import Optional, Union

from ..deps import MissingPackage, require
from ..kube import DEFAULT_TTL
from ..options import MAX_SOCKET_PATH_BYTES
from . import protocol
from .journal import JournalLockedError

DEFAULT_POD_RESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"


def add_parsers(commands) -> None:
    sidecar = commands.add_parser("sidecar", help="serve NVML snapshots and events on a unix socket (one per node)")
    sidecar.add_argument("--socket", default=protocol.DEFAULT_SOCKET, help="unix socket to serve (mode 0660)")
    sidecar.add_argument("--journal", default=protocol.DEFAULT_JOURNAL, help="directory of the event journal")
    sidecar.add_argument("--proc-root", default="/proc", help="where process names and cgroups are read")
    sidecar.add_argument("--pod-resources-socket", default=DEFAULT_POD_RESOURCES,
                         help="the kubelet's pod-resources socket (used when it exists)")
    sidecar.add_argument("--pod-cache-ttl", type=float, default=DEFAULT_TTL, metavar="SECONDS",
                         help="seconds a pod-resources answer is kept while the GPUs' processes keep their "
                              f"containers (default {DEFAULT_TTL:g}; 0 asks for every snapshot)")
    sidecar.add_argument("--nvml-library-path", help="load this libnvidia-ml instead of the system one")
    sidecar.add_argument("--simulate", metavar="SCENARIO", help="serve a simulated node (name or YAML path)")
    sidecar.add_argument("--speed", type=float, default=1.0,
                         help="with --simulate: simulated seconds per real second (default 1)")
    sidecar.add_argument("--start-at", type=float, default=0.0,
                         help="with --simulate: scenario time to start at, as after a restart (default 0)")
    sidecar.add_argument("--journal-wait", type=float, default=30.0, metavar="SECONDS",
                         help="how long to wait for a journal another sidecar still holds (default 30)")
    sidecar.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    healthz = commands.add_parser("healthz", help="exit 0 when the sidecar on the socket is healthy, 1 otherwise")
    healthz.add_argument("--socket", default=protocol.DEFAULT_SOCKET)
    healthz.add_argument("--live", action="store_true",
                         help="exit 0 whenever the sidecar answers, healthy or not (the liveness probe)")


def run_sidecar(args: argparse.Namespace) -> int:
    try:
        require("pynvml")
    except MissingPackage as e:
        sys.stderr.write(f"gpu-monitoring sidecar: {e.package} is not installed: the sidecar needs the "
                         "package's `deps` extra (pip install 'datadog-gpu-monitoring[deps]')\n")
        return 2
    from ..simulator import ScenarioError, SimClock, SimulatedNvml, load
    from ..simulator.node import SimulatedNode
    from .app import Sidecar

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    too_long = _socket_too_long(args.socket)
    if too_long:
        sys.stderr.write(f"gpu-monitoring sidecar: cannot start: {too_long}\n")
        return 1
    library, proc_root, pod_resources, node = args.nvml_library_path, args.proc_root, args.pod_resources_socket, None
    if args.simulate:
        try:
            simulation = SimulatedNvml(load(args.simulate), SimClock(speed=args.speed, start=args.start_at))
        except ScenarioError as e:
            sys.stderr.write(f"gpu-monitoring sidecar: {e}\n")
            return 2
        node = SimulatedNode(simulation)
        options = node.start()
        library, proc_root = simulation.library, options["proc_root"]
        pod_resources = options.get("pod_resources_socket")
    try:
        try:
            sidecar = Sidecar(args.socket, args.journal, library, proc_root, _existing(pod_resources),
                              journal_wait=args.journal_wait, pod_cache_ttl=args.pod_cache_ttl)
        except (OSError, JournalLockedError) as e:
            # Each of these is a deployment mistake the operator fixes from the message alone.
            sys.stderr.write(f"gpu-monitoring sidecar: cannot start: {_start_error(e, args)}\n")
            return 1
        sidecar.serve()
    finally:
        if node is not None:
            node.stop()
    return 0


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
    from .client import SidecarClient, SidecarUnavailable

    try:
        body = SidecarClient(args.socket, timeout=5).get(protocol.HEALTH_PATH)
    except SidecarUnavailable as e:
        sys.stderr.write(f"unhealthy: {e}\n")
        return 1
    print(f"{body.get('status')}: events {body.get('events')}, journal {body.get('journal')}, "
          f"last_seq {body.get('last_seq')}")
    # A sidecar whose journal cannot be written holds its events in memory: restarting it (what a
    # failed liveness probe does) would lose them, so liveness asks only that it answers.
    return 0 if args.live or body.get("status") == "ok" else 1
