"""A watchdog that ends a request when its deadline passes, whatever stage the request is at.

A socket timeout bounds one wait for bytes. Reading the answer's body is bounded as a whole by
`bounded.read_bounded` (and Python bounds a TLS handshake as a whole by the same timeout), but the
response headers are read inside the HTTP library, line by line, where no deadline can reach: a
peer that sends one header byte just inside each socket timeout would hold the check's run
forever. The watchdog shuts the request's socket down when the deadline passes, which ends any
read blocked on it at once.

The sockets are found through connection classes installed in the session's pool managers
(`pool_classes_by_scheme` is urllib3's own place for that), so the Agent's HTTP wrapper keeps its
TLS, proxy and header handling unchanged.
"""

import socket
import threading
from typing import Any, List, Optional

import requests
import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

_current = threading.local()


class DeadlineWatch:
    """While entered, the sockets of this thread's requests are shut down `seconds` from entry."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._sockets: List[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> "DeadlineWatch":
        _current.watch = self
        self._timer.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._timer.cancel()
        _current.watch = None
        with self._lock:
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()

    def add(self, sock: Optional[socket.socket]) -> None:
        if sock is None or sock.fileno() < 0:
            return
        # A handle of its own on the same connection: TLS detaches the socket it wraps, and
        # shutting one handle down ends the connection for every handle.
        handle = socket.fromfd(sock.fileno(), sock.family, sock.type)
        with self._lock:
            self._sockets.append(handle)
            if self.expired:
                _shut(handle)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def watch_sessions(session: requests.Session) -> None:
    """Make the session's pool managers open connections that report their sockets to the
    DeadlineWatch of the thread using them. Idempotent; pools already open keep their class."""
    for adapter in session.adapters.values():
        manager = getattr(adapter, "poolmanager", None)
        if manager is not None and manager.pool_classes_by_scheme is not _WATCHED_POOLS:
            manager.pool_classes_by_scheme = _WATCHED_POOLS


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: nothing left to end


def _report(sock: Optional[socket.socket]) -> None:
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.add(sock)


class _Watched:
    """Reports the socket when it is made (covering connect and TLS handshake) and when a kept-alive
    connection is used again (covering the headers of its next answer)."""

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _report(sock)
        return sock

    def getresponse(self) -> urllib3.response.HTTPResponse:
        _report(self.sock)
        return super().getresponse()


class _WatchedHTTPConnection(_Watched, HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, HTTPSConnection):
    pass


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_WATCHED_POOLS = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}
