"""One HTTP GET that ends by a deadline and stops at a size bound, over a kept-alive connection.

The kubelet's `/pods` is read this way: the Agent's HTTP wrapper (RequestsWrapper) with redirects
refused and no proxy, the body streamed and read piece by piece (`bounded.read_bounded`), and a
watchdog (`DeadlineWatch`) that ends the handshake and headers too.
"""

import logging
from typing import Mapping, Optional, Tuple

import requests
import urllib3
from datadog_checks.base.utils.http import RequestsWrapper

from gpu_monitoring.net.bounded_read import Deadline, check_declared_size, read_bounded
from gpu_monitoring.net.deadline_watch import DeadlineWatch, watch_sessions

log = logging.getLogger(__name__)


def http_wrapper(tls_verify: bool = True, ca_path: Optional[str] = None) -> RequestsWrapper:
    """The Agent's HTTP wrapper for a peer on this node; each request passes its own timeout, what is
    left of its deadline."""
    options = {
        "tls_verify": tls_verify,
        "tls_ca_cert": ca_path,
        # The peer is on this node or its pod network: never reach it through a proxy.
        "skip_proxy": True,
        # A redirect could carry a credential elsewhere, and its answer could come from anyone.
        "allow_redirects": False,
    }
    http = RequestsWrapper(options, {}, logger=log)
    # Nor through the environment's proxy, CA bundle or .netrc settings: looking for them scans the
    # whole environment on every request (about a third of a kept-alive request's CPU).
    http.session.trust_env = False
    # Node-local serving certificates come from a cluster CA or are self-signed; neither names
    # issuer URLs to fetch, so chasing them would only add a connection and an error log per failure.
    # Older bases (37.x, in Agents 7.72 and later) have no such setting: they always chase.
    if hasattr(http, "aia_chasing_max_depth"):
        http.aia_chasing_max_depth = 0
    return http


def bounded_get(
    http: RequestsWrapper, url: str, deadline: Deadline, limit: int, headers: Optional[Mapping[str, str]] = None
) -> Tuple[int, bytes]:
    """The status and body of one request, all of it within `deadline` and at most `limit` bytes of
    body: socket timeouts bound each wait, read_bounded the body, and the watch the handshake and
    headers as well. A redirect's body is never read (b""). Raises ReadLimitExceeded, or what
    requests raises for a connection that fails."""
    left = deadline.remaining()
    watch_sessions(http.session)
    with DeadlineWatch(left) as watch:
        try:
            response = http.get(url, extra_headers=headers, stream=True, timeout=(left, left), persist=True)
            try:
                return response.status_code, _body(response, deadline, limit)
            finally:
                response.close()
        except requests.exceptions.Timeout:
            # The library's text quotes the time left of the deadline, different every run: the
            # reason must read the same while the fault lasts, or it is logged again every run.
            raise deadline.passed() from None
        except Exception:
            if watch.expired:
                raise deadline.passed() from None
            raise


def _body(response: requests.Response, deadline: Deadline, limit: int) -> bytes:
    """The body, decoded, as it arrives: the socket's timeout follows the deadline down, so a peer
    that trickles bytes is cut off at the deadline, and a large answer at `limit`."""
    if 300 <= response.status_code < 400:
        return b""  # a redirect is refused whatever it says
    check_declared_size(response.headers.get("Content-Length"), limit)
    connection = getattr(response.raw, "connection", None)
    sock = getattr(connection, "sock", None)
    set_timeout = sock.settimeout if sock is not None else None
    try:
        return read_bounded(lambda size: response.raw.read1(size, decode_content=True), deadline, limit, set_timeout)
    except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
        raise deadline.passed() from None


def reason_of(error: Exception) -> str:
    """The innermost cause of a requests error, without urllib3's pool and retry wrapping."""
    reason = getattr(error.args[0], "reason", None) if error.args else None
    while reason is not None and reason.args and isinstance(reason.args[0], Exception):
        reason = reason.args[0]
    return str(reason if reason is not None else error)
