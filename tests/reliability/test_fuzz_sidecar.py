"""Property-based fuzzing of what crosses the sidecar's socket: snapshots and event pages as the
check reads them, the check's client answered by anything, and raw requests to a real sidecar.
The only way out is a result, ValueError, SidecarUnavailable or an HTTP status. Budget and
strategies: fuzz_support.py."""

import json
import re
import socket
import string
import threading
from dataclasses import asdict

import pytest
from hypothesis import assume, event, example, given
from hypothesis import strategies as st

from gpu_monitoring.sidecar import protocol
from gpu_monitoring.sidecar.client import EventsPage, SidecarClient, SidecarUnavailable, _events_page
from gpu_monitoring.snapshot import Event, SlurmJob, Snapshot
from tests.sidecar_support import SidecarProcess

from .fuzz_support import (
    CLIENT_EXAMPLES,
    JSON,
    PARSER_EXAMPLES,
    SIDECAR_EXAMPLES,
    TEXT,
    fuzz,
    mutated,
)

# --- sidecar snapshot and events ------------------------------------------------------------


@pytest.fixture(scope="module")
def good_snapshot():
    """A real NodeReader's snapshot of the simulated DGX H100, with events, allocations and a sidecar's
    DCGM read added."""
    from gpu_monitoring.collectors.node_reader import NodeReader
    from gpu_monitoring.nvml.session import NvmlSession
    from gpu_monitoring.simulator.library import SimulatedNvml
    from gpu_monitoring.simulator.scenario import load as load_scenario

    reader = NodeReader(NvmlSession(SimulatedNvml(load_scenario("dgx-h100")).library), proc_root=None,
                              watch_events=False)
    try:
        taken = reader.read().to_dict()
    finally:
        reader.close()
    uuid = taken["devices"][0]["uuid"]
    bus_id = taken["devices"][0]["pci_bus_id"]
    taken["events"] = [asdict(event) for event in (
        Event(uuid, "xid", 79, 1.5, device_index=0, pci_bus_id=bus_id),
        Event(None, "type_0x10", 0, 2, gpu_instance_id=1, compute_instance_id=0),
        # The kernel's line of an XID, with the Slurm job whose process it hit.
        Event(None, "xid", 13, 3.25, pci_bus_id=bus_id, source="kernel", pid=4711, process_name="python",
              slurm=SlurmJob("48213", "0", 1001), detail="Graphics Exception", boot_id="b", kernel_seq=812),
        Event(None, "aer", 0, 4.0, pci_bus_id=bus_id, source="kernel", severity="corrected", reporter="0000:17:01.0"),
    )]
    taken["allocations"] = {"source": "pod_resources", "error": None,
                            "items": [{"namespace": "ml", "pod": "train", "container": "main",
                                       "resource_name": "nvidia.com/gpu", "device_id": uuid,
                                       "claim_name": None, "claim_namespace": None, "pool": None,
                                       "share_id": None},
                                      {"namespace": "ml", "pod": "tune", "container": "main",
                                       "resource_name": "gpu.nvidia.com", "device_id": "gpu-1",
                                       "claim_name": "tune-gpu", "claim_namespace": "ml", "pool": "node-1",
                                       "share_id": None}],
                            "advertised": [{"resource_name": "nvidia.com/gpu", "device_id": uuid}],
                            "advertised_error": None}
    taken["dcgm_read"] = {"status": "critical", "reason": "cannot connect to http://10.0.0.7:9400/metrics: refused"}
    return json.loads(json.dumps(taken))


def _load_snapshot(document):
    try:
        loaded = Snapshot.from_dict(document)
    except ValueError as error:
        assert str(error)
        event("refused")
        return None
    event("loaded")
    assert isinstance(loaded, Snapshot)
    return loaded


def test_a_good_snapshot_reads_back_as_it_was_written(good_snapshot):
    assert len(good_snapshot["devices"]) == 8 and good_snapshot["events"] and good_snapshot["allocations"]["items"]
    assert Snapshot.from_dict(good_snapshot).to_dict() == good_snapshot


@fuzz(PARSER_EXAMPLES)
@given(JSON | st.builds(lambda extra: dict(extra, version=1), st.dictionaries(TEXT, JSON, max_size=4)))
def test_a_snapshot_of_anything_loads_or_raises_value_error(document):
    _load_snapshot(document)


@fuzz(PARSER_EXAMPLES)
@given(data=st.data())
def test_a_damaged_snapshot_loads_or_raises_value_error(good_snapshot, data):
    loaded = _load_snapshot(mutated(data, good_snapshot))
    if loaded is not None:
        # What loads must be what a check can use: it writes back out as JSON without loss of type.
        assert Snapshot.from_dict(json.loads(json.dumps(loaded.to_dict()))).to_dict() == loaded.to_dict()


GOOD_PAGE = {"api_version": 1, "events": [
    {"seq": 7, "device_uuid": "GPU-1", "kind": "xid", "code": 48, "timestamp": 10.0},
    {"seq": 8, "device_uuid": None, "kind": "ecc_dbe", "code": 0, "timestamp": 11, "gpu_instance_id": 2}],
    "last_seq": 8, "first_seq": 1, "lost": False, "epoch": "e"}


def _read_page(body):
    try:
        page = _events_page(body, 0)
    except ValueError as error:
        assert str(error)
        return None
    assert isinstance(page, EventsPage) and all(isinstance(e, Event) for e in page.events)
    return page


def test_a_good_events_page_reads_whole():
    page = _events_page(GOOD_PAGE, 0)
    assert (page.last_seq, page.journal_last_seq, page.lost) == (8, 8, False)
    assert [(e.kind, e.code, e.gpu_instance_id) for e in page.events] == [("xid", 48, None), ("ecc_dbe", 0, 2)]


@fuzz(PARSER_EXAMPLES)
@given(JSON.filter(lambda v: isinstance(v, dict)) | st.builds(lambda events: dict(GOOD_PAGE, events=events), JSON))
def test_an_events_page_of_anything_reads_or_raises_value_error(body):
    _read_page(body)


@fuzz(PARSER_EXAMPLES)
@given(st.data())
def test_a_damaged_events_page_reads_or_raises_value_error(data):
    body = mutated(data, GOOD_PAGE)
    assume(isinstance(body, dict))  # the client takes only an object this far
    _read_page(body)


# --- the check's client, answered by anything -----------------------------------------------


class _AnsweringServer:
    """A unix socket that answers each connection with the bytes set for it, then hangs up."""

    def __init__(self, path):
        self.path = path
        self.answer = b""
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(2)
                try:
                    connection.recv(65536)
                    connection.sendall(self.answer)
                    connection.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


@pytest.fixture(scope="module")
def answering(tmp_path_factory):
    server = _AnsweringServer(str(tmp_path_factory.mktemp("answers") / "s.sock"))
    yield server
    server.close()


def _http(status, body):
    return b"HTTP/1.0 %d X\r\nContent-Length: %d\r\n\r\n" % (status, len(body)) + body


ANSWERS = st.one_of(
    st.binary(max_size=200),
    st.builds(_http, st.sampled_from([200, 200, 404, 500, 503]), st.builds(
        lambda v: json.dumps(v).encode(), JSON | st.builds(lambda s: {"api_version": 1, "snapshot": s}, JSON))),
    st.builds(lambda head, body: head + b"\r\n\r\n" + body,
              st.sampled_from([b"HTTP/1.0 200 OK", b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999",
                               b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked",
                               b"HTTP/1.0 200 OK\r\nContent-Length: -1", b"HTTP/1.0 999 ?",
                               b"HTTP/1.0 200 OK\r\nContent-Length: 3"]),
              st.binary(max_size=40)),
)


@fuzz(CLIENT_EXAMPLES)
@given(data=st.data(), snapshot=st.booleans(), damage=st.booleans())
def test_the_sidecar_client_reads_any_answer_or_raises_unavailable(answering, good_snapshot, data, snapshot, damage):
    good = {"api_version": 1, "snapshot": good_snapshot} if snapshot else GOOD_PAGE
    # Half the answers are a good document, damaged or not, so that the client's checks past HTTP are reached.
    document = mutated(data, good) if damage else good
    answer = data.draw(st.just(_http(200, json.dumps(document).encode())) | ANSWERS, label="answer")
    answering.answer = answer
    client = SidecarClient(answering.path, timeout=2)
    try:
        result = client.snapshot() if snapshot else client.events(0)
    except SidecarUnavailable as error:
        assert str(error)
        event("unavailable")
        return
    event("read")
    assert isinstance(result, Snapshot if snapshot else EventsPage)


# --- HTTP requests to the sidecar -----------------------------------------------------------


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    running = SidecarProcess(tmp_path_factory.mktemp("fuzz-sidecar"), "dgx-h100").start()
    yield running
    running.stop()


TARGETS = st.sampled_from([
    "/healthz", "/v1/snapshot", "/v1/events", "/v1/events?after=0&limit=1", "/v1/events?after=-1",
    "/v1/events?limit=100000", "/v1/events?after=1&after=2", "/v1/events?after=%ff", "/v1/events?x=1",
    "/healthz?x", "*", "", "//healthz", "http://[", "http://host/healthz", "/%00", "/\x7f", "/" + "a" * 300,
]) | st.text(string.printable, max_size=30)
METHODS = st.sampled_from(["GET", "GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "BREW", "get", ""])
VERSIONS = st.sampled_from(["HTTP/1.0", "HTTP/1.1", "HTTP/1.1", "", "HTTP/0.9", "HTTP/2.0", "HTTP/9.9",
                            "HTTP/1.0.0", "HTTP/x", "FTP/1.0"])
HEADERS = st.lists(st.tuples(st.sampled_from(["Host", "Content-Length", "Connection", "Expect", "X", ""]),
                             st.sampled_from(["", "0", "5", "-1", "keep-alive", "close", "100-continue", "\x00"])),
                   max_size=4)


@st.composite
def http_request(draw):
    line = " ".join(part for part in (draw(METHODS), draw(TARGETS), draw(VERSIONS)) if part)
    newline = draw(st.sampled_from(["\r\n", "\n"]))
    head = newline.join([line, *(f"{name}: {value}" for name, value in draw(HEADERS))]) + newline * 2
    return head.encode("latin-1", "replace") + draw(st.binary(max_size=16))


# A malformed request is the client's fault (4xx); 501 and 505 are HTTP's own answers to a method
# or version the server does not implement. 500 would be a bug, and any other status a surprise.
HANDLED = re.compile(rb"HTTP/1\.[01] (2\d\d|4\d\d|501|505) ")


def _ask(path, request):
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(8)  # past the server's 5 s read deadline, well short of the module's budget
    answer = b""
    try:
        connection.connect(path)
        try:
            connection.sendall(request)
            # The request ends where the client stops sending, as a real client that hangs up does.
            connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may refuse an oversized request before it is all sent; its answer still counts
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                return answer
            answer += chunk
    except ConnectionResetError:
        return answer
    finally:
        connection.close()


@fuzz(SIDECAR_EXAMPLES)
@given(st.binary(max_size=300) | http_request())
# What this fuzzer found: a request line without a version was answered with no status line, and a
# target urlsplit cannot read ended in a traceback and a dropped connection.
@example(b"GET\t\x00")
@example(b"GET /healthz\r\n\r\n")
@example(b"GET http://[ HTTP/1.0\r\n\r\n")
def test_the_sidecar_answers_any_request_with_a_status_or_hangs_up(sidecar, request):
    logged = len(sidecar.log_text())
    answer = _ask(sidecar.socket, request)
    assert not answer or HANDLED.match(answer), (request, answer[:300])
    event(f"HTTP {answer[9:12].decode()}" if answer else "hung up")
    # The server logs a failed answer before it hangs up, so the log already holds it here; only this
    # request's lines count, so that shrinking lands on the request that wrote them.
    assert "Traceback" not in sidecar.log_text()[logged:]


def test_the_sidecar_is_healthy_and_quiet_after_fuzzing(sidecar):
    # Runs after the fuzzer in file order; alone, it checks a fresh sidecar, which is harmless.
    assert sidecar.client().get(protocol.HEALTH_PATH)["status"] == "ok"
    assert sidecar.process.poll() is None
    log = sidecar.log_text()
    assert "Traceback" not in log and "could not answer" not in log, log[-3000:]
