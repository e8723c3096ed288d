"""A dcgm-exporter stand-in for fault tests: a real HTTP server on 127.0.0.1 that serves a page
in dcgm-exporter's format, or misbehaves on purpose; pages written for a simulated node's GPUs, and
the exporter's pod as the kubelet lists it."""

import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterable, Mapping, Optional, Tuple

from gpu_monitoring.simulator.http_server import ThreadedServer

PAGES = Path(__file__).parent / "data" / "dcgm"
# ok | slow (answers after `delay`) | garbage (HTML) | oversized | redirect | error (HTTP 503) |
# hangup (answers, then closes the kept-alive connection without saying so, as an idle timeout does) |
# trickle (its status line and headers a byte every 50 ms: each wait is short, the whole is not)
BEHAVIOURS = ("ok", "slow", "garbage", "oversized", "redirect", "error", "hangup", "trickle")
OVERSIZED_BYTES = 17 * 1024 * 1024


def recorded(name: str) -> bytes:
    return (PAGES / name).read_bytes()


def exporter_page(entities: Iterable[Tuple[str, Optional[int], Mapping[str, float]]], energy: int = 1000,
                  timestamp_ms: Optional[int] = None) -> bytes:
    """dcgm-exporter 4.x's page for (GPU UUID, GPU_I_ID or None, {DCGM field: value}) entities, each
    with the energy counter at `energy` (the page's heartbeat), and `timestamp_ms` on every line."""
    stamp = f" {timestamp_ms}" if timestamp_ms is not None else ""
    lines = []
    for gpu, (uuid, instance, values) in enumerate(entities):
        labels = f'gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000000:{gpu:02X}:00.0",device="nvidia{gpu}",' \
                 'modelName="NVIDIA A100-SXM4-80GB"'
        if instance is not None:
            labels += f',GPU_I_PROFILE="1g.10gb",GPU_I_ID="{instance}"'
        labels += ',Hostname="node-1",DCGM_FI_DRIVER_VERSION="535.183.01"'
        for field, value in {**values, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": energy + gpu}.items():
            lines += [f"# HELP {field} help", f"# TYPE {field} gauge", f"{field}{{{labels}}} {value}{stamp}"]
    return ("\n".join(lines) + "\n").encode()


def pod(name, labels=None, image="nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.1-ubuntu22.04", phase="Running",
        ready="True", ip="10.244.3.17", ports=({"name": "metrics", "containerPort": 9400, "protocol": "TCP"},),
        namespace="gpu-operator"):
    """A pod as the kubelet's /pods lists it (the fields discovery reads, and some it does not)."""
    return {
        "metadata": {"uid": f"uid-{name}", "name": name, "namespace": namespace,
                     "labels": {"app": "nvidia-dcgm-exporter", "controller-revision-hash": "5d8f"}
                     if labels is None else labels},
        "spec": {"nodeName": "gpu-node-17", "containers": [
            {"name": "nvidia-dcgm-exporter", "image": image, "ports": list(ports),
             "env": [{"name": "DCGM_EXPORTER_LISTEN", "value": ":9400"}]}]},
        "status": {"phase": phase, "podIP": ip, "hostIP": "192.168.1.17",
                   "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": ready}],
                   "containerStatuses": [{"name": "nvidia-dcgm-exporter", "containerID": "containerd://abc",
                                          "ready": ready == "True"}]},
    }


class ExporterServer(ThreadedServer):
    """Serves `page` at /metrics (plain HTTP, kept-alive connections); use as a context manager."""

    BEHAVIOURS = BEHAVIOURS
    thread_name = "test dcgm-exporter"

    def __init__(self, page: bytes = b"", behaviour: str = "ok", delay: float = 2.0):
        super().__init__(behaviour)
        self.page = page
        self.delay = delay
        self.requests = 0
        self.connections = 0
        self.closed = 0  # connections ended, by either side

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def __enter__(self) -> "ExporterServer":
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        httpd.daemon_threads = True
        self._serve(httpd)
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()


def _handler(server: ExporterServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            server.connections += 1

        def finish(self) -> None:
            super().finish()
            server.closed += 1

        def log_message(self, *_args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            server.requests += 1
            how = server.behaviour
            if how == "slow":
                time.sleep(server.delay)
            if how == "redirect":
                self._answer(302, b"", {"Location": "http://169.254.169.254/metrics"})
            elif how == "error":
                self._answer(503, b"not ready")
            elif how == "garbage":
                self._answer(200, b"<html><body>Welcome to nginx!</body></html>")
            elif how == "oversized":
                self._oversized()
            elif how == "trickle":
                self._trickle()
            else:
                self._answer(200, server.page)
                self.close_connection = how == "hangup"

        def _answer(self, status: int, body: bytes, headers: Mapping[str, str] = {}) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def _trickle(self) -> None:
            try:
                for byte in b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n":
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass  # the client gave up, as it should
            self.close_connection = True

        def _oversized(self) -> None:
            # No Content-Length: only the read's own bound stops it.
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            line = b'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-0"} 0.5\n' * 1024
            try:
                for _ in range(OVERSIZED_BYTES // len(line) + 1):
                    self.wfile.write(line)
            except OSError:
                pass  # the client stopped reading, as it should
            self.close_connection = True

    return Handler
