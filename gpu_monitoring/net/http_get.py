"""One HTTP GET that ends by a deadline and stops at a size bound: how the kubelet's `/pods`,
dcgm-exporter's `/metrics` and the sidecar's API are read.

`bounded_get(peer, target, deadline, limit)` asks `peer` (a connection of this package's, or the
Agent's HTTP wrapper on the check's side) for `target`. Every wait of the exchange, from connecting to
the answer's last byte, ends by `deadline` (deadline_connection); the body is read as it arrives and
stops at `limit` bytes, and one whose Content-Length says more is refused before any of it is read. A
redirect is never followed and its body never read: the answer says where it pointed, the caller
refuses it.

Failures are the standard library's: ReadLimitExceeded for either bound; ssl.SSLError for TLS; OSError
for a connection that cannot be made or breaks (ConnectionError when the peer closes it); and
http.client.HTTPException for an answer that is no HTTP, http.client.IncompleteRead where the peer
closed the connection before the length it declared.
"""

import http.client
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Protocol

from gpu_monitoring.net.bounded_read import Deadline, check_declared_size, read_bounded
from gpu_monitoring.net.deadline_connection import within


class Headers(Protocol):
    def get(self, name: str) -> Optional[str]: ...  # case-insensitive


class Response(Protocol):
    status: int
    headers: Headers

    def read1(self, size: int) -> bytes: ...

    def close(self) -> None: ...


class Peer(Protocol):
    def send(self, target: str, headers: Mapping[str, str]) -> Response: ...

    def discard(self) -> None:
        """Close the connection: what an exchange left unread must not be taken for the next answer."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Headers
    body: bytes  # b"" for a redirect


def bounded_get(
    peer: Peer, target: str, deadline: Deadline, limit: int, headers: Optional[Mapping[str, str]] = None
) -> Answer:
    """The answer to one GET of `target`, all of it within `deadline` and at most `limit` bytes of body."""
    with within(deadline):
        try:
            response = peer.send(target, headers or {})
            try:
                answer = Answer(response.status, response.headers, _body(response, deadline, limit))
            finally:
                response.close()
        except TimeoutError:
            # A socket timeout is what was left of the deadline: the same words whichever bound noticed.
            peer.discard()
            raise deadline.passed() from None
        except BaseException:
            peer.discard()
            raise
    if _is_redirect(answer.status):
        peer.discard()
    return answer


def _body(response: Response, deadline: Deadline, limit: int) -> bytes:
    if _is_redirect(response.status):
        return b""
    declared = response.headers.get("Content-Length")
    check_declared_size(declared, limit)
    body = read_bounded(response.read1, deadline, limit)
    # A coded body's declared length is the coding's, not the decoded body's (urllib3, which decodes,
    # checks the coded length itself).
    short = declared is not None and declared.isdigit() and len(body) < int(declared)
    if short and not response.headers.get("Content-Encoding"):
        raise http.client.IncompleteRead(body, int(declared) - len(body))
    return body


def _is_redirect(status: int) -> bool:
    return 300 <= status < 400


class ConnectionPeer:
    """A Peer on one http.client connection that `connect` makes, made again once discarded.

    A peer may close a kept-alive connection between GETs (its idle timeout, a restart): a GET on a
    connection used before, that fails before any answer, is sent once more on a new connection within
    the same deadline."""

    def __init__(self, connect: Callable[[], http.client.HTTPConnection]) -> None:
        self._connect = connect
        self._connection: Optional[http.client.HTTPConnection] = None

    def send(self, target: str, headers: Mapping[str, str]) -> http.client.HTTPResponse:
        reused = self._connection is not None and self._connection.sock is not None
        try:
            return self._send(target, headers)
        except ConnectionError:  # reset, broken pipe, closed without an answer
            self.discard()
            if not reused:
                raise
            return self._send(target, headers)

    def _send(self, target: str, headers: Mapping[str, str]) -> http.client.HTTPResponse:
        if self._connection is None:
            self._connection = self._connect()
        self._connection.request("GET", target, headers=dict(headers))
        return self._connection.getresponse()

    def discard(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
