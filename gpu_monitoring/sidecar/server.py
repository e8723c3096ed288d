"""The sidecar's HTTP API on a unix socket: snapshot, events after a cursor, health.

Clients cannot hold it: requests are read by the serving thread without blocking (a client
that connects and sends nothing costs a file descriptor until its read deadline, not a
thread), and only complete requests reach the bounded pool of workers, which answer within
a write deadline.
"""

import io
import json
import logging
import os
import selectors
import socket
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Dict, Tuple
from urllib.parse import parse_qs, urlsplit

from gpu_monitoring.sidecar import protocol

log = logging.getLogger(__name__)

Response = Tuple[int, Dict[str, Any]]

WORKERS = 8
# Kubelet probes, the Agent and a CLI may all connect at once: the kernel holds this many until accepted.
BACKLOG = 256
# Connections read or answered at once; more are answered 503 and closed.
MAX_CONNECTIONS = 512
READ_SECONDS = 5.0  # for the request line and headers, whatever the client trickles
WRITE_SECONDS = 10.0  # for the whole answer, whether or not the client reads it
MAX_REQUEST_BYTES = 16 * 1024  # the API takes GET requests with a short query and no body


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class SocketInUse(OSError):
    """The socket path is served by another process, or is something other than a socket."""


class UnixHttpServer:
    """The API on `path` (mode 0660); a stale socket file left by a killed sidecar is replaced."""

    def __init__(self, path: str, routes: Dict[str, Callable[[Dict[str, str]], Response]],
                 workers: int = WORKERS):
        self.routes = routes
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        _claim(path)
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.bind(path)
        os.chmod(path, 0o660)
        self.socket.listen(BACKLOG)
        self.socket.setblocking(False)
        self._workers = ThreadPoolExecutor(workers, thread_name_prefix="sidecar-api")
        self._reading: Dict[socket.socket, _Reading] = {}
        self._answering = 0
        self._answering_lock = threading.Lock()
        self._stop = threading.Event()
        self._stopped = threading.Event()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            try:
                while not self._stop.is_set():
                    for key, _ in selector.select(timeout=min(poll_interval, 0.2)):
                        self._ready(selector, key.fileobj)
                    self._expire(selector)
            finally:
                self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._stopped.wait()

    def server_close(self) -> None:
        self._stop.set()
        for connection in list(self._reading):
            connection.close()
        self._reading.clear()
        self._workers.shutdown(wait=True, cancel_futures=True)
        self.socket.close()

    # --- reading requests without a thread each ----------------------------------------

    def _ready(self, selector: selectors.BaseSelector, ready: Any) -> None:
        if ready is self.socket:
            self._accept(selector)
            return
        reading = self._reading[ready]
        if reading.receive():
            selector.unregister(ready)
            del self._reading[ready]
            if len(reading.data) >= MAX_REQUEST_BYTES:
                _refuse(ready, 431, f"a request to the sidecar fits in {MAX_REQUEST_BYTES} bytes")
            elif reading.complete:
                self._dispatch(reading)
            else:
                ready.close()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        for _ in range(BACKLOG):
            try:
                connection, _ = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: those waiting are taken when some close
                log.debug("sidecar cannot accept a connection now: %s", e)
                return
            connection.setblocking(False)
            if len(self._reading) + self._answering >= MAX_CONNECTIONS:
                _refuse(connection, 503, "the sidecar is answering too many connections; try again")
                continue
            self._reading[connection] = _Reading(connection)
            selector.register(connection, selectors.EVENT_READ)

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        for connection, reading in list(self._reading.items()):
            if now >= reading.deadline:
                selector.unregister(connection)
                del self._reading[connection]
                _refuse(connection, 408, f"no complete request within {READ_SECONDS:g} seconds")

    def _dispatch(self, reading: "_Reading") -> None:
        with self._answering_lock:
            self._answering += 1
        self._workers.submit(self._answer, reading)

    def _answer(self, reading: "_Reading") -> None:
        try:
            reading.connection.setblocking(True)
            # sendall's timeout bounds the whole answer, however slowly the client reads.
            reading.connection.settimeout(WRITE_SECONDS)
            _Handler(reading.connection, reading.data, self)
        except OSError as e:
            log.debug("sidecar client went away or stopped reading: %s", e)
        except Exception:  # a bug: the pool would swallow it without a word
            log.exception("sidecar could not answer a request")
        finally:
            reading.connection.close()
            with self._answering_lock:
                self._answering -= 1


class _Reading:
    """A connection whose request is still arriving."""

    def __init__(self, connection: socket.socket):
        self.connection = connection
        self.deadline = time.monotonic() + READ_SECONDS
        self.data = b""
        self.complete = False

    def receive(self) -> bool:
        """Take what arrived; True once nothing more is to be read (complete, too big or closed)."""
        try:
            chunk = self.connection.recv(MAX_REQUEST_BYTES)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        self.data += chunk
        # A request cut short or oversized is answered too: the handler tells the client what was wrong.
        ended = not chunk or b"\r\n\r\n" in self.data or b"\n\n" in self.data
        self.complete = bool(self.data) and (ended or len(self.data) >= MAX_REQUEST_BYTES)
        return ended or self.complete


def _claim(path: str) -> None:
    """Remove a stale socket file; refuse a live socket or anything that is not a socket."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path} exists and is not a socket: refusing to replace it; remove it or choose "
                          "another --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        # Nothing listens: a sidecar that was killed left it behind.
        if os.path.exists(path):
            os.unlink(path)
        return
    except OSError as e:
        raise SocketInUse(f"{path} cannot be probed ({e}): refusing to replace it") from e
    finally:
        probe.close()
    raise SocketInUse(f"another sidecar is serving {path}: stop it first or choose another --socket")


def _refuse(connection: socket.socket, status: int, message: str) -> None:
    """Answer without a worker; a client that does not take it loses it, not the server."""
    data = json.dumps({"error": message, "api_version": protocol.API_VERSION}).encode()
    head = f"HTTP/1.0 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\n" \
           f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    try:
        connection.send(head.encode() + data)
        _drain(connection)
    except OSError:
        pass
    finally:
        connection.close()


def _drain(connection: socket.socket) -> None:
    # Closing with unread bytes resets the connection and the client loses the answer sent.
    for _ in range(64):
        if not connection.recv(MAX_REQUEST_BYTES):
            return


_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


class _Handler(BaseHTTPRequestHandler):
    """Answers one request the server has read in full; it never waits on the client to send."""

    server: UnixHttpServer
    server_version = "gpu-monitoring-sidecar"

    def __init__(self, connection: socket.socket, request: bytes, server: UnixHttpServer):
        self._request = request
        super().__init__(connection, "unix-socket", server)

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BytesIO(self._request)

    def send_error(self, code: int, message: Any = None, explain: Any = None) -> None:
        # A malformed request is the client's fault: a JSON answer like any other, and no traceback.
        self.close_connection = True
        # An unreadable request line leaves HTTP/0.9, which would answer without a status line.
        self.request_version = self.default_request_version = "HTTP/1.0"
        self._send(code, {"error": message or explain or self.responses.get(code, ("",))[0],
                          "api_version": protocol.API_VERSION})

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        # A request line without a version is HTTP/0.9, answered without a status line or headers:
        # a client could not tell an error from a snapshot. Answer it as HTTP/1.0 like the rest.
        if self.request_version == "HTTP/0.9":
            self.request_version = "HTTP/1.0"
        return parsed

    def do_GET(self) -> None:
        try:
            url = _target(self.path)
            route = self.server.routes.get(url.path)
            if route is None:
                raise ApiError(404, f"no such path {url.path!r}; try {', '.join(sorted(self.server.routes))}")
            status, body = route(_single(parse_qs(url.query, keep_blank_values=True)))
        except ApiError as e:
            status, body = e.status, {"error": str(e)}
        except Exception as e:  # a bug must answer 500, not kill the connection without a word
            log.exception("sidecar request %s failed", self.path)
            status, body = 500, {"error": f"internal error: {e}"}
        self._send(status, dict(body, api_version=protocol.API_VERSION))

    def do_POST(self) -> None:
        self._send(405, {"error": "the sidecar API is read-only: use GET", "api_version": protocol.API_VERSION})

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _send(self, status: int, body: Dict[str, Any]) -> None:
        data = json.dumps(body, sort_keys=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def address_string(self) -> str:
        return "unix-socket"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("sidecar %s", format % args)


def _target(path: str):
    try:
        return urlsplit(path)
    except ValueError:  # an absolute-form target with a broken host (`GET http://[ HTTP/1.0`)
        raise ApiError(400, f"unreadable request target {path!r}") from None


def _single(query: Dict[str, list]) -> Dict[str, str]:
    repeated = [name for name, values in query.items() if len(values) > 1]
    if repeated:
        raise ApiError(400, f"parameter {repeated[0]!r} given more than once")
    return {name: values[0] for name, values in query.items()}


def integer(params: Dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer; got {raw!r}") from None
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be between {low} and {high}; got {value}")
    return value
