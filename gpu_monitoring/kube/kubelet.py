"""The kubelet's `/pods` endpoint, asked safely (what the answer means: `pod_list`).

The kubelet answers on HTTPS (port 10250) to a service-account bearer token. The client
verifies the kubelet's certificate unless told not to, re-reads a rotated token when the
kubelet refuses the one it holds, and asks at most once per TTL however often it is called.

The token goes to the kubelet's URL and nowhere else: redirects are refused, and no message the
client makes (its own, a library's, or text the kubelet sent) carries the token. Each request has
one deadline for the whole exchange, from connecting to the answer's last byte, and reads at most
MAX_BODY_BYTES of the answer (http_get.bounded_get). The HTTP client is the caller's: the check
gives the Agent's own (net.agent_http.AgentHttp).
"""

import http.client
import logging
import os
import re
import ssl
import time
from collections import deque
from typing import Callable, Deque, List, Optional, Set

from gpu_monitoring.kube import DEFAULT_TTL
from gpu_monitoring.kube.pod_list import PodInfo
from gpu_monitoring.kube.pod_list_reader import PodListReader
from gpu_monitoring.net.bounded_read import MIB, Deadline, ReadLimitExceeded
from gpu_monitoring.net.http_get import Answer, Peer, bounded_get
from gpu_monitoring.status import Status

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
# A 110-pod node's /pods is a few MiB (10 to 30 KiB a pod); ten times that is still no real node's.
MAX_BODY_BYTES = 32 * MIB
# Service-account tokens are JWTs of about 1 KiB; anything this long is not a token.
MAX_TOKEN_BYTES = 64 * 1024
REDACTED = "<redacted>"
# A credential in text a server or library wrote, ours or another's (an RFC 6750 token after the
# scheme as headers spell it; this module's own messages say "bearer token" in lower case).
_BEARER = re.compile(r"\b(Bearer\s+)[A-Za-z0-9._~+/-]{8,}=*")

# What reaches the kubelet, given whether to verify its certificate and the CA to verify it against.
HttpClient = Callable[[bool, Optional[str]], Peer]


class KubeletError(Exception):
    """The kubelet could not be read; `status` is the service check status it deserves.

    WARNING: it may answer next time (timeout, connection refused, 5xx).
    CRITICAL: it will not until someone changes something (token, CA, RBAC, URL).
    """

    def __init__(self, status: Status, message: str):
        super().__init__(message)
        self.status = status


class KubeletClient:
    """Reads `url` (the kubelet's `/pods`) at most once per `ttl` seconds.

    Within the TTL, `pods()` returns what the last request brought. A failure is cached the
    same way: until the TTL has passed since the failed request, `pods()` raises the same
    error again without asking, so a kubelet that is down is asked once per TTL rather than
    once per check run, and no earlier answer is ever passed off as current.

    A pod with a field of the wrong type is left out of the list, with one log line while it stays
    so; only an answer that is no pod list at all fails the read.

    `requests` counts the requests sent, a retry after a 401 included. `http` makes the HTTP client.
    """

    def __init__(
        self,
        url: str,
        token_path: Optional[str],
        ca_path: Optional[str],
        tls_verify: bool = True,
        ttl: float = DEFAULT_TTL,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        http: HttpClient,
    ):
        self.url = url
        self.token_path = token_path
        self.ca_path = ca_path if tls_verify else None
        self.tls_verify = tls_verify
        self.ttl = ttl
        self.timeout = timeout
        self.requests = 0
        self._token: Optional[str] = None
        # The tokens read lately, so that an old one a server echoes is scrubbed as well; rotation
        # makes a new one every hour or so, and only the last few can still be in anyone's hands.
        self._secrets: Deque[str] = deque(maxlen=8)
        self._asked_at: Optional[float] = None
        self._pods: List[PodInfo] = []
        self._error: Optional[KubeletError] = None
        self._http = http(tls_verify, self.ca_path)
        self._reader = PodListReader()
        self._skipped: Set[str] = set()

    def pods(self) -> List[PodInfo]:
        now = time.monotonic()
        if self._asked_at is None or now - self._asked_at >= self.ttl:
            self._refresh()
            # Only an attempt that came to an end is remembered, never one that is still to be made.
            self._asked_at = now
        if self._error is not None:
            # A fresh traceback each time, not one that grows with every run.
            raise self._error.with_traceback(None)
        return list(self._pods)

    def _refresh(self) -> None:
        try:
            self._pods, self._error = self._fetch(), None
        except KubeletError as e:
            self._pods, self._error = [], self._scrubbed(e.status, str(e))
        except Exception as e:  # a library's surprise must fail this read, not the run
            message = f"reading the kubelet at {self.url} failed unexpectedly: {type(e).__name__}: {e}"
            self._pods, self._error = [], self._scrubbed(Status.CRITICAL, message)

    def _scrubbed(self, status: Status, message: str) -> KubeletError:
        """The error without its cause (whose text is a library's) and with no token in its message."""
        error = KubeletError(status, self._scrub(message))
        error.__suppress_context__ = True
        return error

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return _BEARER.sub(r"\1" + REDACTED, text)

    def _fetch(self) -> List[PodInfo]:
        deadline = self._deadline()
        self._check_ca_file()
        if self._token is None and self.token_path:
            self._token = self._read_token()
        answer = self._get(deadline)
        if answer.status == 401 and self.token_path:
            # The token may have been rotated on disk since it was read; a retry with the same
            # token would only be refused again.
            previous, self._token = self._token, self._read_token()
            if self._token != previous:
                answer = self._get(deadline)
        self._check_status(answer.status, answer.body)
        return self._parse(answer.body)

    def _deadline(self) -> Deadline:
        try:
            return Deadline(self.timeout)
        except ValueError as e:
            raise KubeletError(Status.CRITICAL, f"the kubelet is not asked: kubelet_timeout is wrong ({e})") from None

    def _get(self, deadline: Deadline) -> Answer:
        """One request, all of it within `deadline`."""
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        self.requests += 1
        try:
            return bounded_get(self._http, self.url, deadline, MAX_BODY_BYTES, headers)
        except ReadLimitExceeded as e:
            raise self._limit_error(e) from None
        except ssl.SSLError as e:
            raise KubeletError(Status.CRITICAL, self._tls_failure(e)) from e
        except OSError as e:
            raise KubeletError(
                Status.WARNING,
                f"cannot connect to the kubelet at {self.url}: {e}; check kubelet_url and that it runs",
            ) from e
        except http.client.HTTPException as e:
            raise KubeletError(Status.CRITICAL, f"cannot request {self.url}: {e}; check kubelet_url") from e

    def _limit_error(self, error: ReadLimitExceeded) -> KubeletError:
        if error.reason == "too_large":
            return KubeletError(
                Status.CRITICAL,
                f"kubelet at {self.url} sent too much: {error}; check that kubelet_url is the kubelet's /pods",
            )
        return KubeletError(
            Status.WARNING,
            f"kubelet at {self.url} did not answer in time: {error}; it may be overloaded (kubelet_timeout)",
        )

    def _tls_failure(self, error: Exception) -> str:
        trusted = f"the CA in {self.ca_path}" if self.ca_path else "the system CA bundle"
        return (
            f"TLS verification of the kubelet at {self.url} failed against {trusted}: {error}; "
            "set kubelet_ca_path to the CA that signed the kubelet's serving certificate, "
            "or kubelet_tls_verify: false"
        )

    def _check_ca_file(self) -> None:
        if self.ca_path and not os.path.exists(self.ca_path):
            raise KubeletError(
                Status.CRITICAL,
                f"kubelet CA file {self.ca_path} does not exist; check kubelet_ca_path (or kubelet_client_ca)",
            )

    def _read_token(self) -> str:
        try:
            with open(self.token_path, "rb") as f:
                raw = f.read(MAX_TOKEN_BYTES + 1)
        except OSError as e:
            raise KubeletError(
                Status.CRITICAL,
                f"cannot read the kubelet bearer token from {self.token_path}: {e}; check kubelet_token_path",
            ) from e
        problem = _token_problem(raw)
        if problem:
            raise KubeletError(Status.CRITICAL, f"the kubelet bearer token file {self.token_path} {problem}")
        token = raw.strip().decode("ascii")
        if token not in self._secrets:
            self._secrets.append(token)
        return token

    def _check_status(self, code: int, body: bytes) -> None:
        if code == 200:
            return
        if 300 <= code < 400:
            raise KubeletError(
                Status.CRITICAL,
                f"kubelet at {self.url} answered with a redirect (HTTP {code}), which is refused: the bearer token "
                "goes to the kubelet alone; set kubelet_url to the kubelet's own address",
            )
        if code == 401:
            source = f"the token in {self.token_path}" if self.token_path else "no bearer token (no token path set)"
            raise KubeletError(
                Status.CRITICAL, f"kubelet at {self.url} refused {source} (HTTP 401); check kubelet_token_path"
            )
        if code == 403:
            raise KubeletError(
                Status.CRITICAL,
                f"kubelet at {self.url} forbade reading pods (HTTP 403); "
                "the service account needs `get` on the `nodes/proxy` resource",
            )
        if code >= 500:
            # The whole body is scrubbed before it is cut, so no part of a token survives the cut.
            excerpt = self._scrub(body.decode("utf-8", "replace"))[:200]
            raise KubeletError(Status.WARNING, f"kubelet at {self.url} failed with HTTP {code}: {excerpt}")
        raise KubeletError(Status.CRITICAL, f"kubelet at {self.url} answered HTTP {code}; check kubelet_url")

    def _parse(self, body: bytes) -> List[PodInfo]:
        try:
            pods, skipped = self._reader.read(body)
        except (ValueError, RecursionError) as e:  # RecursionError: arrays nested past Python's stack
            raise KubeletError(
                Status.CRITICAL,
                f"kubelet at {self.url} did not send a valid pod list ({e}); "
                "check that kubelet_url is the kubelet's /pods",
            ) from e
        self._tell_skipped(set(skipped))
        return pods

    def _tell_skipped(self, skipped: Set[str]) -> None:
        """Each skipped pod's reason once while it stays the same, not every refresh."""
        for reason in sorted(skipped - self._skipped):
            log.warning("%s; its GPUs are named from pod-resources alone", self._scrub(reason))
        self._skipped = skipped


def _token_problem(raw: bytes) -> Optional[str]:
    """What makes a token file's bytes no bearer token (never quoting them), or None."""
    token = raw.strip()
    if len(raw) > MAX_TOKEN_BYTES:
        return f"is larger than {MAX_TOKEN_BYTES} bytes: it holds no bearer token"
    if not token:
        return "is empty"
    try:
        text = token.decode("utf-8")
    except UnicodeDecodeError:
        return "is not UTF-8 text: it holds no bearer token"
    if any(c.isspace() or not c.isprintable() for c in text):
        return "has whitespace or a control character inside the token (a token is one line of printable text)"
    if not text.isascii():
        return "has characters outside ASCII, which an HTTP header cannot carry"
    return None
