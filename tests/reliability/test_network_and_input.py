"""Every network read the check makes ends by a deadline and stops at a size bound; the kubelet's
bearer token goes nowhere but the kubelet and into no message; input of the wrong shape from the
kubelet, the sidecar or pod-resources becomes a service check's reason, never an exception.

The misbehaving peers are real servers on 127.0.0.1 or a unix socket in tmp_path."""

import copy
import json
import logging
import socket
import socketserver
import threading
import time
import traceback
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, List, Optional

import grpc
import pytest
from datadog_checks.base import AgentCheck
from datadog_checks.base.stubs import aggregator as _aggregator

from gpu_monitoring.dcgm.client import DcgmClient, DcgmError
from gpu_monitoring.kube.kubelet import MAX_BODY_BYTES, KubeletClient, KubeletError
from gpu_monitoring.kube.pod_resources import (
    ALLOCATABLE_METHOD,
    LIST_METHOD,
    MAX_RESPONSE_BYTES,
    PodResourcesError,
    list_allocatable,
    list_allocations,
)
from gpu_monitoring.net.agent_http import AgentHttp
from gpu_monitoring.net.bounded_read import MIB
from gpu_monitoring.sidecar.client import SidecarClient, SidecarUnavailable
from gpu_monitoring.simulator.kubelet_server import pod_list
from gpu_monitoring.snapshot import Device, Event, Node, Process, Snapshot
from gpu_monitoring.sources import SIDECAR_CURSOR as CURSOR
from gpu_monitoring.status import Status

from ..attribution_support import funnel, kubelet_check
from ..test_sidecar import SIDECAR_CHECK, sidecar_check

WARNING, CRITICAL = Status.WARNING, Status.CRITICAL
TOKEN = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXBheWxvYWQtMDEyMzQ1Njc4OQ.c2lnbmF0dXJl"
POD = {"uid": "u-1", "name": "trainer-0", "namespace": "ml",
       "containers": [{"name": "trainer", "container_id": "a1b2c3", "limits": {"nvidia.com/gpu": "1"}}]}
# How long a trickling peer keeps at it: past every deadline below, so that a client without one fails.
TRICKLE_SECONDS = 3.0
DEADLINE = 0.5
# What a busy machine may add to a deadline; well short of TRICKLE_SECONDS.
SLACK = 1.0


class Peer:
    """An HTTP server that answers every GET with `answer(handler)` and records the Authorization
    header of each request: on 127.0.0.1, or on the unix socket `unix_path` (a fake sidecar)."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler], None], unix_path: Optional[str] = None):
        self.answer = answer
        self.path = unix_path
        self.authorizations: List[str] = []
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                peer.authorizations.append(self.headers.get("Authorization"))
                try:
                    peer.answer(self)
                except OSError:
                    pass  # the client hung up, as it should on a bad answer

            def log_message(self, *_args) -> None:
                pass

            def address_string(self) -> str:
                return "peer"

        if unix_path:
            self.server = socketserver.ThreadingUnixStreamServer(unix_path, Handler)
        else:
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "Peer":
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def send(handler: BaseHTTPRequestHandler, code: int, body: bytes, **headers: str) -> None:
    handler.send_response(code)
    for name, value in {"Content-Length": str(len(body)), **headers}.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def json_answer(document) -> Callable[[BaseHTTPRequestHandler], None]:
    return lambda handler: send(handler, 200, json.dumps(document).encode(), **{"Content-Type": "application/json"})


def trickle(handler: BaseHTTPRequestHandler) -> None:
    """Headers at once, then one byte of a body that never completes every 50 ms."""
    handler.send_response(200)
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    handler.wfile.flush()
    stop = time.monotonic() + TRICKLE_SECONDS
    while time.monotonic() < stop:
        handler.wfile.write(b" ")
        handler.wfile.flush()
        time.sleep(0.05)


def trickle_headers(handler: BaseHTTPRequestHandler) -> None:
    """A status line, then a header that never ends, one byte every 20 ms."""
    stop = time.monotonic() + TRICKLE_SECONDS
    for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Padding: " + b"x" * 10000:
        if time.monotonic() > stop:
            return
        handler.wfile.write(bytes([byte]))
        handler.wfile.flush()
        time.sleep(0.02)


def cut_short(handler: BaseHTTPRequestHandler) -> None:
    """A Content-Length of 1000, then 10 bytes and the end of the connection (HTTP/1.0)."""
    handler.send_response(200)
    handler.send_header("Content-Length", "1000")
    handler.end_headers()
    handler.wfile.write(b'{"items": ')


def endless(handler: BaseHTTPRequestHandler) -> None:
    """A JSON array without a length that goes on past the kubelet client's bound (HTTP/1.0: the
    body ends when the connection does)."""
    handler.send_response(200)
    handler.end_headers()
    handler.wfile.write(b'{"items": [')
    piece = b"0," * (MIB // 2)
    for _ in range(MAX_BODY_BYTES // len(piece) + 2):
        handler.wfile.write(piece)


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


def kubelet_client(peer: Peer, token_path: str, **options) -> KubeletClient:
    return KubeletClient(f"{peer.url}/pods", token_path, None, tls_verify=False, http=AgentHttp,
                         **{"ttl": 0, **options})


def kubelet_failure(kube: KubeletClient) -> KubeletError:
    with pytest.raises(KubeletError) as raised:
        kube.pods()
    return raised.value


def everything_said(error: BaseException) -> str:
    """The message and the whole traceback, causes and contexts included, as a log with exc_info shows it."""
    return str(error) + "".join(traceback.format_exception(type(error), error, error.__traceback__))


# --- class 1: a total deadline and a size bound (kubelet) ------------------------------------


@pytest.mark.parametrize("answer", [trickle, trickle_headers], ids=["body", "headers"])
def test_a_kubelet_that_trickles_its_answer_is_cut_off_at_the_deadline(token_file, answer):
    with Peer(answer) as peer:
        started = time.monotonic()
        error = kubelet_failure(kubelet_client(peer, token_file, timeout=DEADLINE))
        elapsed = time.monotonic() - started
    assert elapsed < DEADLINE + SLACK, elapsed
    assert error.status == WARNING and "did not answer in time" in str(error), error


def test_a_kubelet_that_trickles_its_tls_handshake_is_cut_off_at_the_deadline(token_file):
    """The server's first TLS record announces 16 KiB and then comes one byte every 20 ms (Python
    bounds a handshake by the socket's timeout as a whole; this keeps that promise tested)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.sendall(b"\x16\x03\x03\x40\x00")
            while not stop.wait(0.02):
                try:
                    connection.sendall(b"\x00")
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    kube = KubeletClient(f"https://127.0.0.1:{listener.getsockname()[1]}/pods", token_file, None,
                         tls_verify=False, ttl=0, timeout=DEADLINE, http=AgentHttp)
    try:
        started = time.monotonic()
        error = kubelet_failure(kube)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        listener.close()
    assert elapsed < DEADLINE + SLACK, elapsed
    assert error.status == WARNING and "did not answer in time" in str(error), error


def test_a_kept_alive_connection_is_watched_on_its_next_request(token_file):
    """The first answer is good and keeps the connection open; the second trickles its headers."""
    answers = iter([json_answer(pod_list([POD])), trickle_headers])
    with Peer(lambda handler: next(answers)(handler)) as peer:
        peer.server.RequestHandlerClass.protocol_version = "HTTP/1.1"
        kube = kubelet_client(peer, token_file, timeout=DEADLINE)
        assert [pod.name for pod in kube.pods()] == ["trainer-0"]
        started = time.monotonic()
        error = kubelet_failure(kube)
        elapsed = time.monotonic() - started
    assert elapsed < DEADLINE + SLACK, elapsed
    assert error.status == WARNING and "did not answer in time" in str(error), error


def test_a_kubelet_body_over_the_bound_is_not_read(token_file):
    with Peer(endless) as peer:
        error = kubelet_failure(kubelet_client(peer, token_file))
    assert error.status == CRITICAL and "larger than 32 MiB" in str(error), error


def test_a_declared_length_over_the_bound_is_refused_before_reading(token_file):
    def huge(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(300 * MIB))
        handler.end_headers()
        handler.wfile.write(b'{"items": []}')

    with Peer(huge) as peer:
        error = kubelet_failure(kubelet_client(peer, token_file))
    assert "larger than 32 MiB" in str(error), error


def test_an_answer_cut_short_of_its_length_is_refused_by_every_client(token_file, tmp_path):
    """The kubelet, dcgm-exporter and sidecar clients read through one GET: none takes a part for the whole."""
    with Peer(cut_short) as peer:
        kubelet = kubelet_failure(kubelet_client(peer, token_file))
        with pytest.raises(DcgmError) as dcgm:
            DcgmClient(f"{peer.url}/metrics").read()
    with fake_sidecar(tmp_path, cut_short) as fake:
        sidecar = sidecar_failure(SidecarClient(fake.path).snapshot)
    assert kubelet.status == CRITICAL and "IncompleteRead(10 bytes read, 990 more expected)" in str(kubelet), kubelet
    assert dcgm.value.status == CRITICAL and "IncompleteRead(10 bytes read, 990 more expected)" in str(dcgm.value)
    assert "closed the connection after 10 of the 1000 bytes" in str(sidecar), sidecar


# --- class 2: the bearer token --------------------------------------------------------------


def test_a_redirect_is_refused_and_the_token_goes_nowhere_else(token_file):
    with Peer(json_answer(pod_list([POD]))) as elsewhere:
        moved = Peer(lambda handler: send(handler, 302, b"", Location=f"{elsewhere.url}/pods"))
        with moved:
            error = kubelet_failure(kubelet_client(moved, token_file))
    assert error.status == CRITICAL and "redirect (HTTP 302), which is refused" in str(error), error
    assert moved.authorizations == [f"Bearer {TOKEN}"]
    assert elsewhere.authorizations == []


@pytest.mark.parametrize(
    "content, problem",
    [
        (TOKEN[:20].encode() + b"\n" + TOKEN[20:].encode(), "whitespace or a control character"),
        (TOKEN[:20].encode() + b"\x01" + TOKEN[20:].encode(), "whitespace or a control character"),
        (TOKEN.encode() + b"\xff\xfe", "is not UTF-8"),
        (TOKEN.encode() + "é".encode(), "outside ASCII"),
        (b"\n \n", "is empty"),
    ],
)
def test_a_token_file_that_holds_no_token_is_refused_by_name(tmp_path, content, problem):
    path = tmp_path / "token"
    path.write_bytes(content)
    with Peer(json_answer(pod_list([POD]))) as peer:
        error = kubelet_failure(kubelet_client(peer, str(path)))
    assert error.status == CRITICAL and str(path) in str(error) and problem in str(error), error
    assert peer.authorizations == []
    said = everything_said(error)
    assert TOKEN[:8] not in said and TOKEN[-8:] not in said, said


@pytest.mark.parametrize("padding", [0, 150, 185])
def test_a_server_error_page_echoing_the_token_is_quoted_without_it(node, caplog, token_file, padding):
    """The echo starts at different places of the 200 characters quoted, so that the cut falls
    before, inside and after the token."""
    caplog.set_level(logging.DEBUG)
    page = ("x" * padding + f"Authorization: Bearer {TOKEN}\nX-Other: Bearer abcdefghijklmnop").encode()
    with Peer(lambda handler: send(handler, 500, page)) as peer:
        dgx = node("dgx-h100", kubelet_url=f"{peer.url}/pods", kubelet_tls_verify=False,
                   kubelet_token_path=token_file, pod_cache_ttl=0)
        dgx.run(2)
        error = kubelet_failure(dgx.check.pods.kubelet)
    check = kubelet_check()
    assert check.status == AgentCheck.WARNING and "failed with HTTP 500" in check.message, check.message
    said = [check.message, everything_said(error)] + [r.getMessage() for r in caplog.records]
    for text in said:
        for piece in (TOKEN[:8], TOKEN[8:16], TOKEN[-8:], "abcdefghijklmnop"):
            assert piece not in text, text
    assert funnel(dgx)["total"] == 8


# --- class 3: failures are never remembered as success; wrong types are reasons -----------------


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf")])
def test_a_kubelet_client_with_an_impossible_timeout_fails_every_read(token_file, timeout):
    with Peer(json_answer(pod_list([POD]))) as peer:
        kube = kubelet_client(peer, token_file, timeout=timeout, ttl=3600)
        for _ in range(3):
            error = kubelet_failure(kube)
            assert error.status == CRITICAL and "kubelet_timeout" in str(error), error
    assert peer.authorizations == []


OTHER_POD = {"uid": "u-2", "name": "server-1", "namespace": "web",
             "containers": [{"name": "web", "container_id": "d4e5"}]}


def wrong(path: tuple, value) -> dict:
    """The simulated pod list (a pod that will be damaged, then a good one) with the value at `path`
    (keys and list indexes) replaced."""
    document = pod_list([{**POD, "containers": [{**POD["containers"][0], "env": {"A": "1"}}]}, OTHER_POD])
    *parents, last = path
    target = document
    for key in parents:
        target = target[key]
    target[last] = value
    return document


POD_0 = ("items", 0)
CONTAINER_0 = (*POD_0, "spec", "containers", 0)
NOT_POD_LISTS = [
    ({"pods": []}, "the answer has no `items`"),
    (["items"], "the answer is an array, not an object"),
    ({"items": {"a": 1}}, "the answer.items is an object, not an array"),
]
BAD_PODS = [
    (POD_0, "pod", "pod items[0] is skipped: it is a string, not an object"),
    ((*POD_0, "metadata", "uid"), 7, "pod ml/trainer-0 is skipped: metadata.uid is an integer, not a string"),
    ((*POD_0, "metadata", "name"), ["a"], "pod items[0] is skipped: metadata.name is an array"),
    ((*POD_0, "metadata", "namespace"), {"ns": 1}, "pod trainer-0 is skipped: metadata.namespace is an object"),
    ((*POD_0, "status", "phase"), True, "pod ml/trainer-0 is skipped: status.phase is a boolean"),
    ((*POD_0, "spec", "containers"), {"name": "x"}, "spec.containers is an object, not an array"),
    ((*CONTAINER_0, "name"), None, "pod ml/trainer-0 is skipped: spec.containers[0] has no `name`"),
    ((*CONTAINER_0, "env", 0, "value"), 1, "spec.containers[0].env[0].value is an integer"),
    ((*CONTAINER_0, "resources", "limits"), ["nvidia.com/gpu"], "limits is an array"),
    ((*CONTAINER_0, "resources", "limits", "nvidia.com/gpu"), {"x": 1}, "limits['nvidia.com/gpu'] is an object"),
    ((*POD_0, "status", "containerStatuses", 0, "containerID"), 5, "containerStatuses[0].containerID is an integer"),
]


@pytest.mark.parametrize("document, reason", NOT_POD_LISTS, ids=[m[1] for m in NOT_POD_LISTS])
def test_an_answer_that_is_no_pod_list_is_a_reason_not_an_exception(token_file, document, reason):
    with Peer(json_answer(document)) as peer:
        kube = kubelet_client(peer, token_file, ttl=3600)
        for _ in range(2):
            error = kubelet_failure(kube)
            assert error.status == CRITICAL and "did not send a valid pod list" in str(error), error
            assert reason in str(error), error
    assert len(peer.authorizations) == 1


@pytest.mark.parametrize("path, value, reason", BAD_PODS, ids=[m[2] for m in BAD_PODS])
def test_a_pod_with_a_wrong_type_costs_that_pod_alone(token_file, caplog, path, value, reason):
    with Peer(json_answer(wrong(path, value))) as peer:
        kube = kubelet_client(peer, token_file)
        for _ in range(3):
            assert [pod.name for pod in kube.pods()] == ["server-1"]
    told = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
    assert len(told) == 1 and reason in told[0], told
    assert len(peer.authorizations) == 3


def test_a_malformed_pod_list_leaves_the_rest_of_the_run_intact(node, token_file):
    with Peer(json_answer({"pods": []})) as peer:
        dgx = node("dgx-h100", kubelet_url=f"{peer.url}/pods", kubelet_tls_verify=False,
                   kubelet_token_path=token_file, pod_cache_ttl=3600)
        dgx.run(3)
    check = kubelet_check()
    assert check.status == AgentCheck.CRITICAL and "the answer has no `items`" in check.message
    assert funnel(dgx)["total"] == 8
    assert set(dgx.values("utilization.gpu")) == set(range(8))



# --- the sidecar: deadline, size bound, and documents of the wrong shape ------------------------


def fake_sidecar(tmp_path, answer: Callable[[BaseHTTPRequestHandler], None]) -> Peer:
    return Peer(answer, unix_path=str(tmp_path / "sidecar.sock"))


def good_snapshot() -> dict:
    process = Process(pid=4242, used_memory=1 << 30, kind="compute")
    device = Device(index=0, uuid="GPU-0", name="NVIDIA H100 PCIe", metrics={"utilization.gpu": 50.0},
                    processes=[process])
    event = Event(device_uuid="GPU-0", kind="xid", code=79, timestamp=1.0)
    return Snapshot(timestamp=1700000000.0, node=Node(driver_version="550.90.07"), devices=[device],
                    events=[event]).to_dict()


def good_events() -> dict:
    record = {"seq": 1, "device_uuid": "GPU-0", "kind": "xid", "code": 79, "timestamp": 1.0}
    return {"api_version": 1, "events": [record], "last_seq": 1, "lost": False}


def sidecar_answer(snapshot: Any, events: Any) -> Callable[[BaseHTTPRequestHandler], None]:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        document = snapshot if handler.path.startswith("/v1/snapshot") else events
        send(handler, 200, json.dumps(document).encode(), **{"Content-Type": "application/json"})

    return answer


def changed(document: dict, path: tuple, value) -> dict:
    document = copy.deepcopy(document)
    *parents, last = path
    target = document
    for key in parents:
        target = target[key]
    target[last] = value
    return document


def sidecar_failure(call: Callable[[], Any]) -> SidecarUnavailable:
    with pytest.raises(SidecarUnavailable) as raised:
        call()
    return raised.value


def test_a_sidecar_that_trickles_its_answer_is_cut_off_at_the_deadline(tmp_path):
    with fake_sidecar(tmp_path, trickle) as fake:
        started = time.monotonic()
        error = sidecar_failure(SidecarClient(fake.path, timeout=DEADLINE).snapshot)
        elapsed = time.monotonic() - started
    assert elapsed < DEADLINE + SLACK, elapsed
    assert f"no complete answer within {DEADLINE:g}s" in str(error), error


def test_a_sidecar_that_trickles_its_headers_is_cut_off_at_the_deadline(tmp_path):
    with fake_sidecar(tmp_path, trickle_headers) as fake:
        started = time.monotonic()
        sidecar_failure(SidecarClient(fake.path, timeout=DEADLINE).snapshot)
        assert time.monotonic() - started < DEADLINE + SLACK


def test_a_sidecar_answer_over_the_bound_is_not_read(tmp_path):
    with fake_sidecar(tmp_path, endless) as fake:
        error = sidecar_failure(SidecarClient(fake.path).snapshot)
    assert "larger than 16 MiB" in str(error), error


SNAPSHOT = ("snapshot",)
BAD_SNAPSHOTS = [
    (SNAPSHOT, [], "the snapshot is an array, not an object"),
    ((*SNAPSHOT, "timestamp"), "1700000000", "snapshot.timestamp is a string, not a number"),
    ((*SNAPSHOT, "devices"), {"0": {}}, "snapshot.devices is an object, not an array"),
    ((*SNAPSHOT, "devices", 0, "index"), "0", "snapshot.devices[0].index is a string"),
    ((*SNAPSHOT, "devices", 0, "index"), 0.5, "snapshot.devices[0].index is a number, not an integer"),
    ((*SNAPSHOT, "devices", 0, "lost"), "no", "snapshot.devices[0].lost is a string, not a boolean"),
    ((*SNAPSHOT, "devices", 0, "metrics", "utilization.gpu"), "50", "metrics['utilization.gpu'] is a string"),
    ((*SNAPSHOT, "devices", 0, "processes", 0, "pid"), True, "processes[0].pid is a boolean, not an integer"),
    ((*SNAPSHOT, "devices", 0, "processes", 0, "kind"), "graphics", "processes[0].kind 'graphics' is not one"),
    ((*SNAPSHOT, "events", 0, "kind"), "reboot", "snapshot.events[0].kind 'reboot' is not one"),
    ((*SNAPSHOT, "allocations", "items"), [{"pod": "p"}], "snapshot.allocations.items[0] has no `namespace`"),
    ((*SNAPSHOT, "version"), 2, "snapshot version 2"),
    (("api_version",), 2, "speaks API version 2"),
]


@pytest.mark.parametrize("path, value, reason", BAD_SNAPSHOTS, ids=[b[2] for b in BAD_SNAPSHOTS])
def test_a_sidecar_snapshot_of_the_wrong_shape_is_a_reason(tmp_path, path, value, reason):
    document = changed({"api_version": 1, "snapshot": good_snapshot()}, path, value)
    with fake_sidecar(tmp_path, sidecar_answer(document, good_events())) as fake:
        check = sidecar_check(fake.path)
        _aggregator.reset()
        assert check.run() == ""
    (state,) = _aggregator.service_checks(SIDECAR_CHECK)
    assert state.status == AgentCheck.CRITICAL and reason in state.message, state.message


BAD_EVENTS = [
    (("events",), {"1": {}}, "events is an object, not an array"),
    (("events", 0), [1, "xid"], "events[0] is an array, not an object"),
    (("events", 0, "seq"), "1", "events[0].seq is a string, not an integer"),
    (("events", 0, "kind"), "reboot", "events[0].kind 'reboot' is not one"),
    (("events", 0, "code"), "79", "events[0].code is a string"),
    (("last_seq",), None, "last_seq is null, not an integer"),
    (("lost",), "no", "lost is a string, not a boolean"),
]


@pytest.mark.parametrize("path, value, reason", BAD_EVENTS, ids=[b[2] for b in BAD_EVENTS])
def test_sidecar_events_of_the_wrong_shape_cost_the_run_nothing_else(tmp_path, caplog, path, value, reason):
    """The snapshot's metrics go out; the events wait in the journal, the cursor stays, the reason is told once."""
    document = {"api_version": 1, "snapshot": good_snapshot()}
    with fake_sidecar(tmp_path, sidecar_answer(document, changed(good_events(), path, value))) as fake:
        error = sidecar_failure(lambda: SidecarClient(fake.path).events(0))
        assert reason in str(error), error
        check = sidecar_check(fake.path)
        for _ in range(3):
            _aggregator.reset()
            assert check.run() == ""
            assert _aggregator.metrics("gpu_monitoring.utilization.gpu"), _aggregator.metric_names
            (state,) = _aggregator.service_checks(SIDECAR_CHECK)
            assert state.status == AgentCheck.WARNING and reason in state.message, state.message
    assert check.read_persistent_cache(CURSOR) in (None, "")
    told = [r.getMessage() for r in caplog.records if "events cannot be read" in r.getMessage()]
    assert len(told) == 1 and reason in told[0], told


# --- pod-resources: an answer over the bound is too large, not rate limiting --------------------


@pytest.fixture
def grpc_answering(tmp_path):
    """grpc_answering(method, answer) serves `answer(request, context)` for one pod-resources method on a
    unix socket in tmp_path and gives its path."""
    started = []

    def serve(method: str, answer: Callable[[bytes, grpc.ServicerContext], bytes]) -> str:
        path = str(tmp_path / "kubelet.sock")
        service, name = method.strip("/").split("/")
        handler = grpc.method_handlers_generic_handler(service, {name: grpc.unary_unary_rpc_method_handler(answer)})
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=(handler,))
        server.add_insecure_port("unix:" + path)
        server.start()
        started.append(server)
        return path

    yield serve
    for server in started:
        server.stop(None).wait()


@pytest.mark.parametrize("method, call", [(LIST_METHOD, list_allocations), (ALLOCATABLE_METHOD, list_allocatable)])
def test_a_pod_resources_answer_over_the_bound_is_too_large_not_rate_limiting(grpc_answering, method, call):
    path = grpc_answering(method, lambda _request, _context: b"\x0a\x00" * (MAX_RESPONSE_BYTES // 2 + 1))
    with pytest.raises(PodResourcesError) as raised:
        call(path)
    assert raised.value.reason == "too_large", raised.value
    assert "larger than 16 MiB" in str(raised.value) and "rate" not in str(raised.value), raised.value


def test_the_kubelets_own_rate_limit_is_still_rate_limiting(grpc_answering):
    path = grpc_answering(LIST_METHOD, lambda _request, context: context.abort(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit"))
    with pytest.raises(PodResourcesError) as raised:
        list_allocations(path)
    assert raised.value.reason == "rate_limited", raised.value


def test_a_pod_resources_server_that_never_answers_ends_at_the_deadline(grpc_answering):
    release = threading.Event()
    path = grpc_answering(LIST_METHOD, lambda _request, _context: release.wait(TRICKLE_SECONDS) and b"")
    started = time.monotonic()
    try:
        with pytest.raises(PodResourcesError) as raised:
            list_allocations(path, timeout=DEADLINE)
    finally:
        release.set()
    assert time.monotonic() - started < DEADLINE + SLACK
    assert raised.value.reason == "timeout", raised.value
