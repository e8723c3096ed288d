"""HTTP connections whose every wait ends by the deadline of the GET they serve (http_get.bounded_get).

A socket timeout bounds one wait for bytes: a peer that sends one byte just inside each timeout would
hold a reader for as long as it liked. So before each wait the timeout is set to what is left of the
deadline: connecting (Python bounds a TLS handshake as a whole by the socket's timeout), sending
(`sendall` is bounded as a whole), and every read of the answer. http.client reads the status line,
the headers and the body through the file its response makes of the socket; that file is where each
read is bounded.

The deadline is the one `within` makes current on this thread, so a connection a library keeps in its
pool (urllib3's, under the Agent's HTTP wrapper) serves each GET by that GET's deadline.
"""

import http.client
import io
import socket
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from gpu_monitoring.net.bounded_read import Deadline

_current = threading.local()


@contextmanager
def within(deadline: Deadline) -> Iterator[None]:
    """While inside, this thread's deadline-bound connections end their waits by `deadline`."""
    outer, _current.deadline = getattr(_current, "deadline", None), deadline
    try:
        yield
    finally:
        _current.deadline = outer


def current() -> Deadline:
    deadline = getattr(_current, "deadline", None)
    if deadline is None:
        raise RuntimeError("a deadline-bound connection was used outside `within(deadline)`")
    return deadline


class DeadlineBound:
    """Bounds an http.client connection, or a subclass of one such as urllib3's, by the current
    deadline: the first base of a connection class."""

    sock: Optional[socket.socket]
    timeout: Optional[float]

    def connect(self) -> None:
        self.timeout = current().remaining()  # connect and TLS handshake, as a whole
        super().connect()

    def send(self, data) -> None:
        if self.sock is not None:
            self.sock.settimeout(current().remaining())
        super().send(data)

    def response_class(self, sock, **kwargs) -> http.client.HTTPResponse:
        """http.client's response, reading through the deadline (http.client calls this to make one)."""
        return http.client.HTTPResponse(_DeadlineSocket(sock, current()), **kwargs)


class TcpConnection(DeadlineBound, http.client.HTTPConnection):
    pass


class TlsConnection(DeadlineBound, http.client.HTTPSConnection):
    pass


class UnixConnection(DeadlineBound, http.client.HTTPConnection):
    """HTTP on the unix socket at `socket_path`; requests name the host `localhost`."""

    def __init__(self, socket_path: str) -> None:
        super().__init__("localhost")
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(current().remaining())
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _DeadlineSocket:
    """What http.client's response reads from: the socket's own file, each read of it bounded by the
    deadline. The file holds its own reference to the socket, so that the connection closing it (an
    answer that ends the connection) leaves the answer readable to its end."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._sock.makefile(mode, buffering=0), self._deadline))


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: socket.socket, raw: io.RawIOBase, deadline: Deadline) -> None:
        super().__init__()
        self._sock = sock
        self._raw = raw
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> Optional[int]:
        self._sock.settimeout(self._deadline.remaining())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()
