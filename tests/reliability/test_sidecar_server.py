"""The sidecar's unix-socket server cannot be pushed over: bursts of clients,
clients that stall, malformed requests, and a socket path that is not the sidecar's to take.

Every test talks to a real sidecar subprocess over its own socket, with bounded client counts.
"""

import json
import os
import socket
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpu_monitoring.sidecar.client import SidecarUnavailable
from tests.sidecar_support import SidecarProcess

SCENARIO = "legacy-driver"
BURST = 100
STALLED = 300
# The server's read deadline is 5 s; a stalled client must be let go well before a second one.
LET_GO_SECONDS = 9.0


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    running = SidecarProcess(tmp_path_factory.mktemp("server"), SCENARIO).start()
    yield running
    running.stop()


def _connect(path: str, timeout: float = 10.0) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(timeout)
    connection.connect(path)
    return connection


def _exchange(path: str, request: bytes, timeout: float = 10.0) -> bytes:
    with _connect(path, timeout) as connection:
        connection.sendall(request)
        return _read_all(connection)


def _read_all(connection: socket.socket) -> bytes:
    answer = b""
    while True:
        chunk = connection.recv(65536)
        if not chunk:
            return answer
        answer += chunk


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def _timed_health(path: str, start: threading.Barrier) -> float:
    start.wait()
    began = time.monotonic()
    answer = _exchange(path, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert _status(answer) == 200, answer[:200]
    return time.monotonic() - began


def test_a_burst_of_clients_is_answered(sidecar):
    start = threading.Barrier(BURST)
    with ThreadPoolExecutor(BURST) as pool:
        latencies = sorted(pool.map(lambda _: _timed_health(sidecar.socket, start), range(BURST)))
    p99 = latencies[int(0.99 * len(latencies)) - 1]
    print(f"{BURST} concurrent clients: all answered; median {statistics.median(latencies) * 1000:.1f} ms, "
          f"p99 {p99 * 1000:.1f} ms")
    assert p99 < 5.0


def test_stalled_clients_hold_no_one_up_and_are_let_go(sidecar):
    stalled = [_connect(sidecar.socket) for _ in range(STALLED)]
    try:
        for connection in stalled[::2]:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: sid")  # half a request
        began = time.monotonic()
        assert sidecar.client().get("/healthz")["status"] == "ok"
        healthy = time.monotonic() - began
        assert healthy < 2.0
        for connection in stalled:
            connection.settimeout(max(0.1, began + LET_GO_SECONDS - time.monotonic()))
            assert _status(_read_all(connection)) in (0, 408)
        print(f"{STALLED} stalled clients: a healthy client answered in {healthy * 1000:.1f} ms; "
              f"all stalled ones let go within {time.monotonic() - began:.1f} s")
    finally:
        for connection in stalled:
            connection.close()
    assert "Traceback" not in sidecar.log_text()


MALFORMED = [
    b"garbage\r\n\r\n",
    b"GET\r\n\r\n",
    b"GET /healthz HTTP/9.9\r\n\r\n",
    b"\x00\xff\xfe\r\n\r\n",
    b"GET /" + b"a" * 70000 + b" HTTP/1.0\r\n\r\n",
    b"GET /healthz HTTP/1.0\r\n" + b"X-Long: " + b"b" * 70000 + b"\r\n\r\n",
    b"GET /healthz HTTP/1.0\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n",
    b"GET /v1/events?after=%ff%fe HTTP/1.0\r\n\r\n",
]


@pytest.mark.parametrize("request_bytes", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_requests_are_answered_400_without_a_traceback(sidecar, request_bytes):
    answer = _exchange(sidecar.socket, request_bytes)
    assert 400 <= _status(answer) < 600 and _status(answer) != 500, answer[:300]
    assert "error" in json.loads(answer.partition(b"\r\n\r\n")[2])
    assert "Traceback" not in sidecar.log_text()
    assert sidecar.client().get("/healthz")["status"] == "ok"


def test_a_client_that_hangs_up_costs_no_traceback(sidecar):
    for _ in range(20):
        with _connect(sidecar.socket) as connection:
            connection.sendall(b"GET /v1/snapshot HTTP/1.0\r\n\r\n")
    assert sidecar.client().get("/healthz")["status"] == "ok"
    assert "Traceback" not in sidecar.log_text()


# --- the socket path at start ------------------------------------------------------------


def _refused(second: SidecarProcess) -> str:
    second.start_process()
    assert second.process.wait(timeout=60) != 0
    return second.log_text()


class _Second(SidecarProcess):
    def start_process(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)


def test_a_live_socket_is_not_taken(sidecar, tmp_path):
    serving = os.stat(sidecar.socket).st_ino
    second = _Second(tmp_path, SCENARIO)
    second.socket = sidecar.socket
    second.args[second.args.index("--socket") + 1] = sidecar.socket
    assert "another sidecar is serving" in _refused(second)
    assert sidecar.process.poll() is None
    assert os.stat(sidecar.socket).st_ino == serving
    assert sidecar.client().get("/healthz")["status"] == "ok"


def test_a_path_that_is_no_socket_is_left_alone(tmp_path):
    second = _Second(tmp_path, SCENARIO)
    (tmp_path / "run").mkdir()
    with open(second.socket, "w") as f:
        f.write("someone's data\n")
    assert "is not a socket" in _refused(second)
    with open(second.socket) as f:
        assert f.read() == "someone's data\n"


def test_a_stale_socket_is_replaced(tmp_path):
    sidecar = SidecarProcess(tmp_path, SCENARIO)
    (tmp_path / "run").mkdir()
    left_behind = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left_behind.bind(sidecar.socket)
    left_behind.close()  # as a killed sidecar leaves it: the file, and nothing listening
    try:
        sidecar.start()
        assert sidecar.client().get("/healthz")["status"] == "ok"
    finally:
        assert sidecar.stop() == 0
    with pytest.raises(SidecarUnavailable):
        sidecar.client().get("/healthz")
