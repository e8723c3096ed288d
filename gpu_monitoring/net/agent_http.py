"""The Agent's HTTP wrapper (RequestsWrapper) as a peer of http_get.bounded_get: how the check reads the
kubelet. It needs the Agent's base package, which the sidecar does without: only the check imports it.

Its connections are deadline_connection's, installed in the wrapper's pool managers
(`pool_classes_by_scheme` is urllib3's own place for that), so the wrapper keeps its TLS and header
handling, and each wait of a GET, the handshake and headers included, ends by the GET's deadline.
requests' and urllib3's errors are raised as the standard library's, which bounded_get's callers know.
"""

import http.client
import logging
import ssl
from typing import Mapping, Optional

import requests
import urllib3
from datadog_checks.base.utils.http import RequestsWrapper
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from gpu_monitoring.net.deadline_connection import DeadlineBound, current

log = logging.getLogger(__name__)


class AgentHttp:
    """A Peer (http_get) for a peer on this node, through the Agent's HTTP wrapper: certificates
    verified against `ca_path` (the system's CAs without one) unless `tls_verify` is false, redirects
    refused, no proxy, one connection kept alive from GET to GET."""

    def __init__(self, tls_verify: bool = True, ca_path: Optional[str] = None) -> None:
        self.wrapper = _wrapper(tls_verify, ca_path)

    def send(self, target: str, headers: Mapping[str, str]) -> "_Streamed":
        _watch(self.wrapper.session)
        left = current().remaining()
        try:
            response = self.wrapper.get(target, extra_headers=dict(headers), stream=True, timeout=(left, left),
                                        persist=True)
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as e:
            raise _standard(e) from e
        return _Streamed(response)

    def discard(self) -> None:
        """Nothing to do: urllib3 leaves a connection whose exchange failed out of its pool."""


class _Streamed:
    """A streamed answer, read as bounded_get reads one: the body decoded as it arrives."""

    def __init__(self, response: requests.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers = response.headers

    def read1(self, size: int) -> bytes:
        try:
            return self._response.raw.read1(size, decode_content=True)
        except urllib3.exceptions.HTTPError as e:
            raise _standard(e) from e

    def close(self) -> None:
        self._response.close()


def _wrapper(tls_verify: bool, ca_path: Optional[str]) -> RequestsWrapper:
    """The Agent's HTTP wrapper for a peer on this node; each GET passes its own timeout, what is left
    of its deadline."""
    options = {
        "tls_verify": tls_verify,
        "tls_ca_cert": ca_path,
        # The peer is on this node or its pod network: never reach it through a proxy.
        "skip_proxy": True,
        # A redirect could carry a credential elsewhere, and its answer could come from anyone.
        "allow_redirects": False,
    }
    wrapper = RequestsWrapper(options, {}, logger=log)
    # Nor through the environment's proxy, CA bundle or .netrc settings: looking for them scans the
    # whole environment on every request (about a third of a kept-alive request's CPU).
    wrapper.session.trust_env = False
    # Node-local serving certificates come from a cluster CA or are self-signed; neither names
    # issuer URLs to fetch, so chasing them would only add a connection and an error log per failure.
    # Older bases (37.x, in Agents 7.72 and later) have no such setting: they always chase.
    if hasattr(wrapper, "aia_chasing_max_depth"):
        wrapper.aia_chasing_max_depth = 0
    return wrapper


def _watch(session: requests.Session) -> None:
    """Make the session's pool managers open deadline-bound connections. Idempotent; pools already
    open keep their class."""
    for adapter in session.adapters.values():
        manager = getattr(adapter, "poolmanager", None)
        if manager is not None and manager.pool_classes_by_scheme is not _DEADLINE_POOLS:
            manager.pool_classes_by_scheme = _DEADLINE_POOLS


def _standard(error: Exception) -> Exception:
    """requests' or urllib3's error as the standard library's, with the innermost cause's words."""
    reason = _reason_of(error)
    if isinstance(error, (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError)):
        return TimeoutError(reason)
    if isinstance(error, (requests.exceptions.SSLError, urllib3.exceptions.SSLError)):
        return ssl.SSLError(reason)
    if isinstance(error, requests.exceptions.ConnectionError):
        return ConnectionError(reason)
    return http.client.HTTPException(reason)


def _reason_of(error: Exception) -> str:
    """The innermost cause of a requests error, without urllib3's pool and retry wrapping."""
    reason = getattr(error.args[0], "reason", None) if error.args else None
    while reason is not None and reason.args and isinstance(reason.args[0], Exception):
        reason = reason.args[0]
    return str(reason if reason is not None else error)


class _HTTPConnection(DeadlineBound, HTTPConnection):
    pass


class _HTTPSConnection(DeadlineBound, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_DEADLINE_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}
