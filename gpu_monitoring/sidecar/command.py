"""`gpu-monitoring sidecar` and `gpu-monitoring healthz`."""

import argparse
import logging
import os
import sys
import time
from typing import Any, Callable, Mapping, Optional, Union

from gpu_monitoring.config.proc_root import default_proc_root
from gpu_monitoring.deps import MissingPackage, require
from gpu_monitoring.options.rules import KERNEL_LOG_NONE, RULES, Rule, exporter_url
from gpu_monitoring.options.spec_options import DEFAULTS
from gpu_monitoring.options.value_checks import OptionError, socket_path, text
from gpu_monitoring.sidecar import protocol
from gpu_monitoring.sidecar.journal import JournalLockedError


def add_parsers(commands) -> None:
    sidecar = commands.add_parser(
        "sidecar", help="serve NVML snapshots and events on a unix socket (one per node)",
        description="Own NVML on this GPU node, journal its XID and ECC events, and serve snapshots and the "
                    "journal to the gpu_monitoring check (source: sidecar) on a unix socket.")
    # Where the check has the same option (spec.yaml; sidecar_socket for --socket), a flag takes its default
    # and its rule, and a value the rule refuses is an error naming the flag.
    sidecar.add_argument("--socket", default=DEFAULTS["sidecar_socket"], metavar="PATH",
                         type=_checked("--socket", socket_path),
                         help="unix socket to serve, mode 0660 (default %(default)s)")
    sidecar.add_argument("--journal", default=protocol.DEFAULT_JOURNAL, metavar="DIR",
                         help="directory of the event journal (default %(default)s)")
    sidecar.add_argument("--proc-root", metavar="DIR", type=_checked("--proc-root", text),
                         help="where process names and cgroups are read, the host's /proc (default /host/proc if "
                              "it exists, else /proc)")
    sidecar.add_argument("--sysfs-root", default=DEFAULTS["sysfs_root"], metavar="DIR",
                         type=_checked("--sysfs-root", text),
                         help="where the kernel's sysfs is read: the NVIDIA functions on the PCI bus (GPUs the driver "
                              "or NVML misses) and the InfiniBand and RoCE ports (default %(default)s; in a container, "
                              "the host's /sys mounted read-only)")
    # Unset, not the default: with --simulate the simulated node's own log stands in unless the flag is given.
    sidecar.add_argument("--kernel-log", metavar="auto|none|PATH", type=_checked("--kernel-log", RULES["kernel_log"]),
                         help="where the node's kernel log is read, for what NVML did not or cannot say: XIDs raised "
                              "while nothing listened and the process an application XID hit, GPUs the driver could "
                              "not initialise, NVSwitch SXids, ConnectX health and PCIe AER errors; only the messages "
                              "of the NVIDIA driver, NVSwitch, ConnectX and PCIe AER it recognises are read, no other "
                              "line is kept or served. auto: /dev/kmsg where it can be read (in a container, the "
                              "host's mounted read-only at /dev/kmsg; where kernel.dmesg_restrict is 1, with "
                              "CAP_SYSLOG); a path: a text log the host keeps (kern.log, journalctl -k -o short-iso "
                              "or dmesg -T output) or a file of /dev/kmsg records; none: not read (default "
                              f"{DEFAULTS['kernel_log']}; with --simulate, the simulated node's)")
    sidecar.add_argument("--pod-resources-socket", metavar="PATH", type=_checked("--pod-resources-socket", socket_path),
                         help=f"the kubelet's pod-resources socket; connecting to it needs uid 0 (default "
                              f"{DEFAULTS['pod_resources_socket']}, read in a pod or where it exists; with "
                              "--simulate, the simulated node's when its scenario has pods, otherwise only one given "
                              "here)")
    sidecar.add_argument("--pod-cache-ttl", default=DEFAULTS["pod_cache_ttl"], metavar="SECONDS",
                         type=_checked("--pod-cache-ttl", RULES["pod_cache_ttl"], float),
                         help="seconds a pod-resources answer is kept while the GPUs' processes keep their "
                              "containers; 0 asks for every snapshot (default %(default)g)")
    # A URL only: `auto` (finding the exporter) takes the kubelet's pod list, which only the check reads.
    sidecar.add_argument("--dcgm-exporter-url", metavar="URL", type=_checked("--dcgm-exporter-url", exporter_url),
                         help="read this node's dcgm-exporter (http://HOST:9400/metrics) with every snapshot and "
                              "serve DCGM's profiling activity for the GPUs GPM does not measure; the check then "
                              "reads it no more (default: not read here; the check reads it, finding it itself "
                              "on Kubernetes)")
    sidecar.add_argument("--nvml-library-path", metavar="PATH", type=_checked("--nvml-library-path", text),
                         help="load this libnvidia-ml (default: the one the dynamic linker finds)")
    sidecar.add_argument("--simulate", metavar="SCENARIO", type=_checked("--simulate", text),
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
    healthz.add_argument("--socket", default=DEFAULTS["sidecar_socket"], metavar="PATH",
                         type=_checked("--socket", socket_path),
                         help="the unix socket the sidecar serves, its --socket (default %(default)s)")
    healthz.add_argument("--live", action="store_true",
                         help="exit 0 whenever the sidecar answers, ready or not: a sidecar whose journal fails "
                              "holds its events in memory, and a restart would lose them (default: off)")


def run_sidecar(args: argparse.Namespace) -> int:
    try:
        require("pynvml")
    except MissingPackage as e:
        sys.stderr.write(f"gpu-monitoring sidecar: {e.package} is not installed: the sidecar needs the "
                         "package's `sidecar` extra on a Python of its own (pip install "
                         "'datadog-gpu-monitoring[sidecar]'), its `deps` extra beside the Agent's "
                         "(pip install 'datadog-gpu-monitoring[deps]')\n")
        return 2
    from gpu_monitoring.nvml.library import LibraryPath
    from gpu_monitoring.sidecar.app import Sidecar
    from gpu_monitoring.simulator.clock import SimClock
    from gpu_monitoring.simulator.node import simulated_node
    from gpu_monitoring.simulator.scenario import ScenarioError

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    requested = args.pod_resources_socket
    library = LibraryPath(args.nvml_library_path, "--nvml-library-path") if args.nvml_library_path else None
    proc_root, sysfs_root, node = args.proc_root or default_proc_root(), args.sysfs_root, None
    pod_resources = requested or DEFAULTS["pod_resources_socket"]
    kernel_log = kernel_log_setting(args.kernel_log)
    if args.simulate:
        try:
            node = simulated_node(args.simulate, SimClock(speed=args.speed, start=args.start_at))
        except ScenarioError as e:
            sys.stderr.write(f"gpu-monitoring sidecar: {e}\n")
            return 2
        options = node.start(serve_kubelet=False)  # the sidecar reads pod-resources, never /pods
        library, proc_root, sysfs_root = node.nvml.library, options["proc_root"], options.get("sysfs_root", sysfs_root)
        kernel_log = kernel_log_setting(args.kernel_log, options)
        # A scenario with pods serves its own pod-resources; one without reads only a socket given here.
        pod_resources = options.get("pod_resources_socket", requested)
    try:
        try:
            sidecar = Sidecar(args.socket, args.journal, library, proc_root, _existing(pod_resources),
                              journal_wait=args.journal_wait, pod_cache_ttl=args.pod_cache_ttl,
                              dcgm_exporter_url=args.dcgm_exporter_url, sysfs_root=sysfs_root, kernel_log=kernel_log,
                              clock=node.wall_time if node is not None else time.time)
        except (OSError, JournalLockedError) as e:
            # Each of these is a deployment mistake the operator fixes from the message alone.
            sys.stderr.write(f"gpu-monitoring sidecar: cannot start: {_start_error(e, args)}\n")
            return 1
        sidecar.serve()
    finally:
        if node is not None:
            node.stop()
    return 0


def kernel_log_setting(given: Optional[str], simulated: Optional[Mapping[str, Any]] = None) -> str:
    """--kernel-log as given; else, with --simulate, the simulated node's own log of records, `none` where it
    keeps none (the host's log would put real records beside simulated GPUs); else the check's default."""
    if given is not None:
        return given
    if simulated is not None:
        return simulated.get("kernel_log", KERNEL_LOG_NONE)
    return DEFAULTS["kernel_log"]


def _checked(flag: str, rule: Rule, parse: Callable[[str], Any] = str) -> Callable[[str], Any]:
    """An argparse type: the flag's value, parsed, checked by `rule` as the check checks its option;
    a value it refuses is argparse's error, which names the flag."""

    def check(value: str) -> Any:
        try:
            parsed = parse(value)
        except ValueError:
            parsed = value  # the rule refuses it, saying what it accepts
        try:
            return rule(flag, parsed)
        except OptionError as e:
            raise argparse.ArgumentTypeError(e.requirement) from None

    return check


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
