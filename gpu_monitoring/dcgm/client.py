"""dcgm-exporter's `/metrics`, read safely and cheaply: one deadline for the whole exchange, a size
bound, no redirect followed (http_get.bounded_get), and one connection kept alive from run to run.

The exchange is the standard library's http.client: a GET through `requests` costs over a millisecond
of CPU, ten times what parsing the page does.
"""

import http.client
import ssl
from urllib.parse import urlsplit

from gpu_monitoring.net.bounded_read import MIB, Deadline, ReadLimitExceeded
from gpu_monitoring.net.deadline_connection import TcpConnection, TlsConnection
from gpu_monitoring.net.http_get import ConnectionPeer, bounded_get
from gpu_monitoring.status import Status

# The exporter renders its page from samples DCGM already holds: it answers in milliseconds, and a
# run must not wait on it long. Few seconds leave the run's other reads their time.
DEFAULT_TIMEOUT = 3.0
# An 8-GPU node with every GPU in seven MIG instances and all of DCGM's fields is under 2 MiB.
MAX_BODY_BYTES = 16 * MIB
_ACCEPT = {"Accept": "text/plain"}


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
        self._parts = urlsplit(url)
        self._path = (self._parts.path or "/") + (f"?{self._parts.query}" if self._parts.query else "")
        self._peer = ConnectionPeer(self._connect)

    def read(self) -> bytes:
        try:
            answer = bounded_get(self._peer, self._path, Deadline(self.timeout), MAX_BODY_BYTES, _ACCEPT)
        except Exception as e:
            raise _failure(self.url, e) from None
        if 300 <= answer.status < 400:
            location = answer.headers.get("Location")
            raise DcgmError(Status.CRITICAL, f"{self.url} answered with a redirect (HTTP {answer.status}), which is "
                                             f"refused: it points at {location or 'no Location'}; dcgm_exporter_url "
                                             "must name the exporter's own /metrics")
        if answer.status != 200:
            raise DcgmError(Status.CRITICAL, f"{self.url} answered HTTP {answer.status}")
        return answer.body

    def _connect(self) -> http.client.HTTPConnection:
        parts = self._parts
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise http.client.InvalidURL(f"dcgm_exporter_url must be an http or https URL; got {self.url!r}")
        if parts.scheme == "https":
            # Verified against the system's CAs and the URL's host name.
            return TlsConnection(parts.hostname, parts.port, context=ssl.create_default_context())
        return TcpConnection(parts.hostname, parts.port)

    def close(self) -> None:
        self._peer.discard()


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
