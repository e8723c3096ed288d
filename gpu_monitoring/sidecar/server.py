"""The sidecar's HTTP API on a unix socket: snapshot, events after a cursor, health."""

import json
import logging
import os
import socketserver
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Dict, Tuple
from urllib.parse import parse_qs, urlsplit

from . import protocol

log = logging.getLogger(__name__)

Response = Tuple[int, Dict[str, Any]]


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class UnixHttpServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """One thread per request; the socket file is replaced if stale and made 0660."""

    daemon_threads = True

    def __init__(self, path: str, routes: Dict[str, Callable[[Dict[str, str]], Response]]):
        self.routes = routes
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        super().__init__(path, _Handler)
        os.chmod(path, 0o660)


class _Handler(BaseHTTPRequestHandler):
    server: UnixHttpServer
    server_version = "gpu-monitoring-sidecar"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        route = self.server.routes.get(url.path)
        try:
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
