"""A kubelet `/pods` endpoint over real HTTPS on 127.0.0.1, for tests and the demo.

At start it makes its own CA and a server certificate for 127.0.0.1 and localhost, writes
the CA certificate and the bearer token to files (as a service account's mount would), and
serves `GET /pods` in the kubelet's JSON form from plain pod descriptions:

    {"uid": ..., "name": ..., "namespace": ..., "phase": "Running",
     "labels": {"app": ...}, "pod_ip": "10.0.0.7", "owner": {"kind": "DaemonSet", "name": ...},
     "containers": [{"name": ..., "container_id": "abc...", "runtime": "containerd",
                     "env": {"LITERAL": "1", "FROM_FIELD": {"fieldRef": {...}}},
                     "limits": {"nvidia.com/gpu": "1"},
                     "image": "nvcr.io/...", "ports": [{"name": "metrics", "containerPort": 9400}]}],
     "init_containers": [...same shape...]}

A Running pod whose containers have all started is Ready, as its condition says. A pod's `owner`
is its controlling owner in `metadata.ownerReferences`.

A container whose `container_id` is None has not started: it gets no status entry. An env
value that is a mapping becomes a `valueFrom` entry, as the kubelet shows downward-API and
secret references.

`behaviour` makes it misbehave on purpose: `ok`, `unauthorized` (always 401), `garbage`
(200 with a body that is not JSON), `slow` (answers after `delay` seconds), `error` (500).
"""

import datetime
import ipaddress
import json
import os
import socket
import ssl
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpu_monitoring.simulator.http_server import ThreadedServer

BEHAVIOURS = ("ok", "unauthorized", "garbage", "slow", "error")
# Controllers outside apps/v1 (DaemonSet, ReplicaSet, StatefulSet are there).
_OWNER_API_VERSIONS = {"Job": "batch/v1", "CronJob": "batch/v1", "Node": "v1"}
# A client that connects and never speaks must not hold a server thread for long.
SOCKET_TIMEOUT = 10.0


def pod_list(pods: Iterable[Mapping[str, Any]]) -> Dict[str, Any]:
    """The kubelet's `/pods` JSON for the given pod descriptions."""
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [_pod(p) for p in pods]}


def _pod(pod: Mapping[str, Any]) -> Dict[str, Any]:
    containers = pod.get("containers", [])
    init_containers = pod.get("init_containers", [])
    phase = pod.get("phase", "Running")
    ready = phase == "Running" and all(c.get("container_id") is not None for c in containers)
    status = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": str(ready)}],
        "containerStatuses": _statuses(containers),
        "initContainerStatuses": _statuses(init_containers),
    }
    if pod.get("pod_ip"):
        status.update(podIP=pod["pod_ip"], podIPs=[{"ip": pod["pod_ip"]}])
    metadata = {"uid": pod["uid"], "name": pod["name"], "namespace": pod.get("namespace", "default"),
                "labels": dict(pod.get("labels", {}))}
    if pod.get("owner"):
        metadata["ownerReferences"] = [_owner_reference(pod["owner"], metadata["namespace"])]
    return {
        "metadata": metadata,
        "spec": {
            "containers": [_container_spec(c) for c in containers],
            "initContainers": [_container_spec(c) for c in init_containers],
        },
        "status": status,
    }


def _owner_reference(owner: Mapping[str, str], namespace: str) -> Dict[str, Any]:
    """A controller's reference, as the controller manager writes it on the pods it makes."""
    kind, name = owner["kind"], owner["name"]
    return {
        "apiVersion": _OWNER_API_VERSIONS.get(kind, "apps/v1"),
        "kind": kind,
        "name": name,
        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{kind}/{namespace}/{name}")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _container_spec(container: Mapping[str, Any]) -> Dict[str, Any]:
    env = [
        {"name": name, "valueFrom": value} if isinstance(value, Mapping) else {"name": name, "value": value}
        for name, value in container.get("env", {}).items()
    ]
    limits = dict(container.get("limits", {}))
    spec = {"name": container["name"], "env": env, "resources": {"limits": limits, "requests": limits}}
    spec.update({key: container[key] for key in ("image", "ports") if key in container})
    return spec


def _statuses(containers: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    return [
        {"name": c["name"], "containerID": _container_id(c), "ready": True}
        for c in containers
        if c.get("container_id") is not None
    ]


def _container_id(container: Mapping[str, Any]) -> str:
    container_id = container["container_id"]
    if "://" in container_id:
        return container_id
    return f"{container.get('runtime', 'containerd')}://{container_id}"


class KubeletServer(ThreadedServer):
    """An HTTPS kubelet serving `/pods`; use as a context manager or call start() and stop()."""

    BEHAVIOURS = BEHAVIOURS
    thread_name = "kubelet-server"

    def __init__(
        self,
        pods: Iterable[Mapping[str, Any]] = (),
        token: Optional[str] = "secret",
        behaviour: str = "ok",
        directory: Optional[str] = None,
        delay: float = 1.0,
    ):
        super().__init__(behaviour)
        self.delay = delay
        self.requests = 0
        self.connections = 0  # TLS connections accepted: one serves many requests while the client keeps it
        self._pods = list(pods)
        self._token = token
        self._lock = threading.Lock()
        self._tempdir = None if directory else tempfile.TemporaryDirectory(prefix="kubelet-")
        self.directory = directory or self._tempdir.name
        self.ca_path = os.path.join(self.directory, "ca.crt")
        self.token_path = os.path.join(self.directory, "token")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def pods_url(self) -> str:
        return self.url + "/pods"

    def start(self) -> "KubeletServer":
        os.makedirs(self.directory, exist_ok=True)
        context = _tls_context(self.directory, self.ca_path)
        self.write_token_file()
        self._serve(_TlsServer(("127.0.0.1", 0), _Handler, context, self))
        return self

    def stop(self) -> None:
        super().stop()
        if self._tempdir is not None:
            self._tempdir.cleanup()

    def __enter__(self) -> "KubeletServer":
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()

    def set_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            self._pods = list(pods)

    def set_token(self, token: Optional[str], write_file: bool = False) -> None:
        """Accept only `token` from now on; the file keeps the old one unless `write_file`."""
        with self._lock:
            self._token = token
        if write_file:
            self.write_token_file()

    def write_token_file(self, token: Optional[str] = None) -> None:
        """Write `token` (default: the one the server accepts) where clients read it, atomically."""
        value = token if token is not None else (self._token or "")
        staging = self.token_path + ".new"
        with open(staging, "w") as f:
            f.write(value + "\n")
        os.replace(staging, self.token_path)

    def _answer(self, path: str, authorization: Optional[str]) -> Tuple[int, bytes]:
        """(status, body) for one request; counts it."""
        with self._lock:
            self.requests += 1
            token, pods, behaviour = self._token, list(self._pods), self._behaviour
        if behaviour == "unauthorized" or (token is not None and authorization != f"Bearer {token}"):
            return 401, b"Unauthorized"
        if path.split("?", 1)[0] != "/pods":
            return 404, b"404 page not found"
        if behaviour == "error":
            return 500, b"internal error"
        if behaviour == "garbage":
            return 200, b"<html>not a pod list"
        if behaviour == "slow":
            time.sleep(self.delay)
        return 200, json.dumps(pod_list(pods)).encode()


class _TlsServer(ThreadingHTTPServer):
    daemon_threads = True
    # A request thread asleep in `slow` must not hold up stop().
    block_on_close = False

    def __init__(self, address, handler, context: ssl.SSLContext, kubelet: KubeletServer):
        self.tls_context = context
        self.kubelet = kubelet
        super().__init__(address, handler)

    def finish_request(self, request: socket.socket, client_address) -> None:
        # The handshake runs here, on the request's own thread, so a slow or failing client
        # never stalls the accept loop.
        request.settimeout(SOCKET_TIMEOUT)
        self.kubelet.connections += 1
        with self.tls_context.wrap_socket(request, server_side=True, do_handshake_on_connect=False) as tls:
            tls.do_handshake()
            self.RequestHandlerClass(tls, client_address, self)

    def handle_error(self, request, client_address) -> None:
        # Clients that reject the certificate or hang up on a slow answer are expected here.
        pass


class _Handler(BaseHTTPRequestHandler):
    server: _TlsServer
    server_version = "kubelet"
    protocol_version = "HTTP/1.1"  # keeps connections open between requests, as the kubelet does

    def do_GET(self) -> None:
        status, body = self.server.kubelet._answer(self.path, self.headers.get("Authorization"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if status == 200 else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        # Quiet: the demo runs this server beside the Agent's own output.
        pass


def _tls_context(directory: str, ca_path: str) -> ssl.SSLContext:
    """A server context whose certificate chains to a fresh CA written to `ca_path`."""
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(ca_key)
    server_cert = _server_certificate(server_key, ca_key, ca_cert)
    cert_path, key_path = os.path.join(directory, "server.crt"), os.path.join(directory, "server.key")
    _write(ca_path, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(cert_path, server_cert.public_bytes(serialization.Encoding.PEM))
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write(key_path, key_pem, mode=0o600)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "simulated-kubelet-ca")])
    return (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _server_certificate(
    key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    return (
        _builder(name, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(san, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        # Backdated a little so a client clock slightly behind still accepts it.
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _write(path: str, data: bytes, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
