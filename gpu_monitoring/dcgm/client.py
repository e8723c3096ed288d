"""dcgm-exporter's `/metrics`, read safely and cheaply: one deadline for the whole exchange, a size
bound, no redirect followed, and one connection kept alive from run to run.

The exchange is the standard library's http.client on a connection this client keeps: a GET through
`requests` costs over a millisecond of CPU, ten times what parsing the page does. Before every
read of the socket its timeout is set to what is left of the deadline, and the connection's
connect and send are given the same, so the whole exchange (connect, TLS, headers, body) ends by
the deadline whatever pace the exporter keeps.
"""

import http.client
import io
import ssl
from typing import Optional, Tuple
from urllib.parse import urlsplit

from gpu_monitoring.health.service_checks import Status
from gpu_monitoring.net.bounded_read import MIB, Deadline, ReadLimitExceeded, check_declared_size, read_bounded

# The exporter renders its page from samples DCGM already holds: it answers in milliseconds, and a
# run must not wait on it long. Few seconds leave the run's other reads their time.
DEFAULT_TIMEOUT = 3.0
# An 8-GPU node with every GPU in seven MIG instances and all of DCGM's fields is under 2 MiB.
MAX_BODY_BYTES = 16 * MIB


class DcgmError(Exception):
    """The exporter could not be read; `status` is the service check status it deserves."""

    def __init__(self, status: Status, message: str):
        super().__init__(message)
        self.status = status


class DcgmClient:
    """Reads one exporter's page, on one connection kept from read to read."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT):
        self.url = url
        self.timeout = timeout
        self._connection: Optional[_Deadlined] = None

    def read(self) -> bytes:
        try:
            status, location, body = self._exchange(Deadline(self.timeout))
        except Exception as e:
            self.close()  # what the exchange left unread must not be taken for the next answer
            raise _failure(self.url, e) from None
        if 300 <= status < 400:
            raise DcgmError(Status.CRITICAL, f"{self.url} answered with a redirect (HTTP {status}), which is refused: "
                                             f"it points at {location or 'no Location'}; dcgm_exporter_url must name "
                                             "the exporter's own /metrics")
        if status != 200:
            raise DcgmError(Status.CRITICAL, f"{self.url} answered HTTP {status}")
        return body

    def _exchange(self, deadline: Deadline) -> Tuple[int, Optional[str], bytes]:
        """One GET on the kept connection. An exporter may close a kept-alive connection between runs
        (its idle timeout, a restart): a connection used before that fails before any answer is
        opened again once, within the same deadline; a GET can be sent twice."""
        reused = self._connection is not None and self._connection.sock is not None
        try:
            return self._get(deadline)
        except ConnectionError:  # reset, broken pipe, closed without an answer
            self.close()
            if not reused:
                raise
            return self._get(deadline)

    def _get(self, deadline: Deadline) -> Tuple[int, Optional[str], bytes]:
        connection = self._connection or self._open()
        connection.deadline = deadline
        try:
            connection.request("GET", connection.path, headers={"Accept": "text/plain"})
            response = connection.getresponse()
            try:
                if response.status != 200:
                    # Whatever else it says is not read: the connection goes, the next run opens another.
                    self.close()
                    return response.status, response.getheader("Location"), b""
                check_declared_size(response.getheader("Content-Length"), MAX_BODY_BYTES)
                return response.status, None, read_bounded(response.read1, deadline, MAX_BODY_BYTES)
            finally:
                response.close()  # read to its end, or given up: either way the connection may serve the next
        except TimeoutError:
            # The socket's timeout was what was left of the deadline: the same words whichever noticed.
            raise deadline.passed() from None

    def _open(self) -> "_Deadlined":
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise http.client.InvalidURL(f"dcgm_exporter_url must be an http or https URL; got {self.url!r}")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if parts.scheme == "https":
            # Verified against the system's CAs and the URL's host name.
            self._connection = _HTTPSConnection(parts.hostname, parts.port, path, context=ssl.create_default_context())
        else:
            self._connection = _HTTPConnection(parts.hostname, parts.port, path)
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class _Deadlined:
    """A connection whose every wait is bounded by what is left of `deadline`, set before each request."""

    deadline: Deadline
    sock: object
    timeout: Optional[float]

    def __init__(self, host: str, port: Optional[int], path: str, **kwargs) -> None:
        super().__init__(host, port, **kwargs)
        self.path = path

    def connect(self) -> None:
        self.timeout = self.deadline.remaining()  # connect and TLS handshake, as a whole
        super().connect()

    def send(self, data) -> None:
        if self.sock is not None:
            self.sock.settimeout(self.deadline.remaining())  # sendall is bounded as a whole
        super().send(data)

    def response_class(self, sock, **kwargs) -> http.client.HTTPResponse:
        """http.client's response, reading through _DeadlineSocket (http.client calls this to make one)."""
        return http.client.HTTPResponse(_DeadlineSocket(sock, self.deadline), **kwargs)


class _HTTPConnection(_Deadlined, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Deadlined, http.client.HTTPSConnection):
    pass


class _DeadlineSocket:
    """What http.client's response reads from: the socket's own file, each read of it bounded by the
    deadline. The file holds its own reference to the socket, so that the connection closing it (an
    answer that ends the connection) leaves the answer readable to its end."""

    def __init__(self, sock, deadline: Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._sock.makefile(mode, buffering=0), self._deadline))


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock, raw: io.RawIOBase, deadline: Deadline) -> None:
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


def _failure(url: str, error: Exception) -> Exception:
    """The DcgmError a failed exchange is, or the error itself where it is none this client expects."""
    if isinstance(error, ReadLimitExceeded):
        if error.reason == "too_large":
            return DcgmError(Status.CRITICAL, f"{url} sent too much: {error}")
        # It answers, if late: values may come next run.
        return DcgmError(Status.WARNING, f"{url} did not answer in time: {error}; it may be overloaded")
    if isinstance(error, http.client.RemoteDisconnected):
        return DcgmError(Status.CRITICAL, f"cannot connect to {url}: it closed the connection without an answer")
    if isinstance(error, (OSError, http.client.HTTPException)):
        return DcgmError(Status.CRITICAL, f"cannot connect to {url}: {str(error) or type(error).__name__}")
    return error
