"""The kubelet's `/pods` endpoint: which pods and containers run on this node, and what they asked for.

The kubelet answers on HTTPS (port 10250) to a service-account bearer token. The client
verifies the kubelet's certificate unless told not to, re-reads a rotated token when the
kubelet refuses the one it holds, and asks at most once per TTL however often it is called.
"""

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional
from urllib.parse import urlparse

import requests
from datadog_checks.base import ConfigurationError, is_affirmative
from datadog_checks.base.utils.http import RequestsWrapper

from ..options import boolean, number, text

try:
    import datadog_agent
except ImportError:
    from datadog_checks.base.stubs import datadog_agent

log = logging.getLogger(__name__)

WARNING = "WARNING"
CRITICAL = "CRITICAL"
TERMINAL_PHASES = ("Succeeded", "Failed")
GPU_RESOURCE_PREFIX = "nvidia.com/"
DEFAULT_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
DEFAULT_CA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
DEFAULT_HOST = "localhost"
DEFAULT_PORT = 10250
DEFAULT_TTL = 30.0
DEFAULT_TIMEOUT = 5.0


@dataclass(frozen=True)
class ContainerInfo:
    name: str
    container_id: Optional[str]
    env: Dict[str, str] = field(default_factory=dict)
    gpu_limits: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PodInfo:
    uid: str
    name: str
    namespace: str
    phase: str
    containers: List[ContainerInfo] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        """Succeeded or Failed: its devices are free again even if pod-resources still lists them."""
        return self.phase in TERMINAL_PHASES


class KubeletError(Exception):
    """The kubelet could not be read; `status` is the service check status it deserves.

    WARNING: it may answer next time (timeout, connection refused, 5xx).
    CRITICAL: it will not until someone changes something (token, CA, RBAC, URL).
    """

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class KubeletClient:
    """Reads `url` (the kubelet's `/pods`) at most once per `ttl` seconds.

    Within the TTL, `pods()` returns what the last request brought. A failure is cached the
    same way: until the TTL has passed since the failed request, `pods()` raises the same
    error again without asking, so a kubelet that is down is asked once per TTL rather than
    once per check run, and no earlier answer is ever passed off as current.

    `requests` counts the requests sent, a retry after a 401 included.
    """

    def __init__(
        self,
        url: str,
        token_path: Optional[str],
        ca_path: Optional[str],
        tls_verify: bool = True,
        ttl: float = DEFAULT_TTL,
        timeout: float = DEFAULT_TIMEOUT,
    ):
        self.url = url
        self.token_path = token_path
        self.ca_path = ca_path if tls_verify else None
        self.tls_verify = tls_verify
        self.ttl = ttl
        self.requests = 0
        self._token: Optional[str] = None
        self._asked_at: Optional[float] = None
        self._pods: List[PodInfo] = []
        self._error: Optional[KubeletError] = None
        self._http = _http_wrapper(self.ca_path, tls_verify, timeout)

    def pods(self) -> List[PodInfo]:
        now = time.monotonic()
        if self._asked_at is None or now - self._asked_at >= self.ttl:
            self._asked_at = now
            self._refresh()
        if self._error is not None:
            # A fresh traceback each time, not one that grows with every run.
            raise self._error.with_traceback(None)
        return list(self._pods)

    def _refresh(self) -> None:
        try:
            self._pods, self._error = self._fetch(), None
        except KubeletError as e:
            self._pods, self._error = [], e

    def _fetch(self) -> List[PodInfo]:
        self._check_ca_file()
        if self._token is None and self.token_path:
            self._token = self._read_token()
        response = self._get()
        if response.status_code == 401 and self.token_path:
            # The token may have been rotated on disk since it was read; a retry with the same
            # token would only be refused again.
            previous, self._token = self._token, self._read_token()
            if self._token != previous:
                response = self._get()
        self._check_status(response)
        return self._parse(response)

    def _get(self) -> requests.Response:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        self.requests += 1
        try:
            return self._http.get(self.url, extra_headers=headers)
        except requests.exceptions.SSLError as e:
            raise KubeletError(CRITICAL, self._tls_failure(e)) from e
        except requests.exceptions.Timeout as e:
            raise KubeletError(WARNING, f"kubelet at {self.url} did not answer in time: {_reason(e)}") from e
        except requests.exceptions.ConnectionError as e:
            raise KubeletError(
                WARNING,
                f"cannot connect to the kubelet at {self.url}: {_reason(e)}; check kubelet_url and that it runs",
            ) from e
        except requests.exceptions.RequestException as e:
            raise KubeletError(CRITICAL, f"cannot request {self.url}: {e}; check kubelet_url") from e

    def _tls_failure(self, error: Exception) -> str:
        trusted = f"the CA in {self.ca_path}" if self.ca_path else "the system CA bundle"
        return (
            f"TLS verification of the kubelet at {self.url} failed against {trusted}: {_reason(error)}; "
            "set kubelet_ca_path to the CA that signed the kubelet's serving certificate, "
            "or kubelet_tls_verify: false"
        )

    def _check_ca_file(self) -> None:
        if self.ca_path and not os.path.exists(self.ca_path):
            raise KubeletError(
                CRITICAL, f"kubelet CA file {self.ca_path} does not exist; check kubelet_ca_path (or kubelet_client_ca)"
            )

    def _read_token(self) -> str:
        try:
            with open(self.token_path) as f:
                token = f.read().strip()
        except OSError as e:
            raise KubeletError(
                CRITICAL, f"cannot read the kubelet bearer token from {self.token_path}: {e}; check kubelet_token_path"
            ) from e
        if not token:
            raise KubeletError(CRITICAL, f"the kubelet bearer token file {self.token_path} is empty")
        return token

    def _check_status(self, response: requests.Response) -> None:
        code = response.status_code
        if code == 200:
            return
        if code == 401:
            source = f"the token in {self.token_path}" if self.token_path else "no bearer token (no token path set)"
            raise KubeletError(CRITICAL, f"kubelet at {self.url} refused {source} (HTTP 401); check kubelet_token_path")
        if code == 403:
            raise KubeletError(
                CRITICAL,
                f"kubelet at {self.url} forbade reading pods (HTTP 403); "
                "the service account needs `get` on the `nodes/proxy` resource",
            )
        if code >= 500:
            raise KubeletError(WARNING, f"kubelet at {self.url} failed with HTTP {code}: {response.text[:200]}")
        raise KubeletError(CRITICAL, f"kubelet at {self.url} answered HTTP {code}; check kubelet_url")

    def _parse(self, response: requests.Response) -> List[PodInfo]:
        try:
            return parse_pod_list(response.json())
        except ValueError as e:
            raise KubeletError(
                CRITICAL,
                f"kubelet at {self.url} did not send a valid pod list ({e}); "
                "check that kubelet_url is the kubelet's /pods",
            ) from e


def _reason(error: Exception) -> str:
    """The innermost cause of a requests error, without urllib3's pool and retry wrapping."""
    reason = getattr(error.args[0], "reason", None) if error.args else None
    while reason is not None and reason.args and isinstance(reason.args[0], Exception):
        reason = reason.args[0]
    return str(reason if reason is not None else error)


def _http_wrapper(ca_path: Optional[str], tls_verify: bool, timeout: float) -> RequestsWrapper:
    options = {
        "tls_verify": tls_verify,
        "tls_ca_cert": ca_path,
        "timeout": timeout,
        # The kubelet is on this node: never reach it through a proxy.
        "skip_proxy": True,
    }
    http = RequestsWrapper(options, {}, logger=log)
    # Kubelet serving certificates come from the cluster CA or are self-signed; neither names
    # issuer URLs to fetch, so chasing them would only add a connection and an error log per failure.
    # Older bases (37.x, in Agents 7.72 and later) have no such setting: they always chase.
    if hasattr(http, "aia_chasing_max_depth"):
        http.aia_chasing_max_depth = 0
    return http


def parse_pod_list(payload: Any) -> List[PodInfo]:
    """PodInfo for every pod in a `/pods` answer; ValueError when it is not a pod list."""
    if not isinstance(payload, dict) or not isinstance(payload.get("items"), list):
        raise ValueError("no `items` list in the answer")
    try:
        return [_pod(item) for item in payload["items"]]
    except (AttributeError, KeyError, TypeError) as e:
        raise ValueError(f"malformed pod: {e!r}") from e


def _pod(item: Mapping[str, Any]) -> PodInfo:
    metadata, spec, status = item["metadata"], item.get("spec") or {}, item.get("status") or {}
    ids = {s["name"]: _strip_runtime(s.get("containerID")) for s in status.get("containerStatuses") or []}
    return PodInfo(
        uid=metadata["uid"],
        name=metadata["name"],
        namespace=metadata.get("namespace", ""),
        phase=status.get("phase", "Unknown"),
        containers=[_container(c, ids.get(c["name"])) for c in spec.get("containers") or []],
    )


def _container(spec: Mapping[str, Any], container_id: Optional[str]) -> ContainerInfo:
    limits = (spec.get("resources") or {}).get("limits") or {}
    return ContainerInfo(
        name=spec["name"],
        container_id=container_id,
        # The API leaves out `value` when it is the empty string; `valueFrom` values are not in the spec.
        env={e["name"]: e.get("value", "") for e in spec.get("env") or [] if "valueFrom" not in e},
        gpu_limits={k: str(v) for k, v in limits.items() if k.startswith(GPU_RESOURCE_PREFIX)},
    )


def _strip_runtime(container_id: Optional[str]) -> Optional[str]:
    """`containerd://abc` -> `abc`; the runtime prefix is not part of the ID cgroups show."""
    if not container_id:
        return None
    return container_id.split("://", 1)[-1]


def kubelet_settings(instance: Mapping[str, Any]) -> Dict[str, Any]:
    """KubeletClient arguments: the instance's options, else the Agent's kubelet settings, else defaults."""
    tls_verify = boolean(instance, "kubelet_tls_verify", None)
    if tls_verify is None:
        agent_value = _agent_config("kubelet_tls_verify")
        tls_verify = True if agent_value is None else is_affirmative(agent_value)
    return {
        "url": _instance_url(instance) or _agent_url(),
        "token_path": text(instance, "kubelet_token_path")
        or _agent_config("kubelet_auth_token_path")
        or DEFAULT_TOKEN_PATH,
        "ca_path": text(instance, "kubelet_ca_path") or _agent_config("kubelet_client_ca") or DEFAULT_CA_PATH,
        "tls_verify": tls_verify,
        "ttl": number(instance, "pod_cache_ttl", DEFAULT_TTL, minimum=0),
        "timeout": number(instance, "kubelet_timeout", DEFAULT_TIMEOUT, minimum=0),
    }


def _agent_config(key: str) -> Any:
    """The Agent's setting, or None where it has none (the Agent answers '' for unset keys)."""
    value = datadog_agent.get_config(key)
    return None if value in (None, "") else value


def _agent_url() -> str:
    host = _agent_config("kubernetes_kubelet_host") or os.environ.get("DD_KUBERNETES_KUBELET_HOST") or DEFAULT_HOST
    port = _agent_config("kubernetes_https_kubelet_port") or DEFAULT_PORT
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"https://{host}:{int(port)}/pods"


def _instance_url(instance: Mapping[str, Any]) -> Optional[str]:
    """`kubelet_url` as given, with `/pods` added when it names only the kubelet."""
    url = text(instance, "kubelet_url")
    if url is None:
        return None
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigurationError(f"`kubelet_url` must be an http(s) URL such as https://host:10250; got {url!r}")
    return url if parsed.path not in ("", "/") else url.rstrip("/") + "/pods"
