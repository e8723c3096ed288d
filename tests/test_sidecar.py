"""The sidecar as a real subprocess: its API on the unix socket, and the check reading it."""

import http.client
import json
import socket

import pytest
from datadog_checks.base import AgentCheck
from datadog_checks.base.stubs import aggregator as _aggregator

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.cli.main import main

from .conftest import tag_dict
from .sidecar_support import SidecarProcess, sidecar_check, sidecars_fixture, socket_mode, wait_until  # noqa: F401

SIDECAR_CHECK = "gpu_monitoring.sidecar.can_connect"


def raw_request(path, method="GET", target="/healthz"):
    connection = http.client.HTTPConnection("localhost", timeout=10)
    connection.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.sock.connect(path)
    connection.request(method, target)
    response = connection.getresponse()
    body = json.loads(response.read())
    connection.close()
    return response.status, body


# --- the API ------------------------------------------------------------------------------


def test_snapshot_events_and_health(sidecars):
    sidecar = sidecars("dgx-h100")
    assert socket_mode(sidecar.socket) == 0o660
    status, snapshot = raw_request(sidecar.socket, target="/v1/snapshot")
    assert status == 200 and snapshot["api_version"] == 1
    assert snapshot["snapshot"]["version"] == 1
    assert len(snapshot["snapshot"]["devices"]) == 8
    # The sidecar reads pod-resources and the proc root too: allocations and process owners travel.
    assert snapshot["snapshot"]["allocations"]["source"] == "pod_resources"
    assert len(snapshot["snapshot"]["allocations"]["items"]) == 7
    owners = [p["container_id"] for d in snapshot["snapshot"]["devices"] for p in d["processes"]]
    assert owners and all(owners)
    status, events = raw_request(sidecar.socket, target="/v1/events?after=0&limit=10")
    # No NVML event yet: what the kernel's log told of this boot, the driver's load among it.
    assert status == 200 and {e["source"] for e in events["events"]} == {"kernel"}
    assert [e["detail"] for e in events["events"] if e["kind"] == "driver_loaded"] == ["550.90.07"]
    status, health = raw_request(sidecar.socket)
    assert status == 200 and health["status"] == "ok" and health["snapshots_served"] == 1
    assert health["kernel_log"] == "ok"


@pytest.mark.parametrize("target, status, says", [
    ("/v2/snapshot", 404, "no such path"),
    ("/v1/events?after=x", 400, "after must be an integer"),
    ("/v1/events?limit=0", 400, "limit must be between 1 and 1000"),
    ("/v1/events?limit=5000", 400, "limit must be between 1 and 1000"),
    ("/v1/events?after=1&after=2", 400, "more than once"),
    ("/v1/events?cursor=3", 400, "unknown parameter 'cursor'"),
    ("/v1/snapshot?fresh=1", 400, "unknown parameter 'fresh'"),
])
def test_bad_requests_get_json_errors(sidecars, target, status, says):
    sidecar = sidecars("legacy-driver")
    answered, body = raw_request(sidecar.socket, target=target)
    assert answered == status
    assert says in body["error"] and body["api_version"] == 1


def test_writes_are_refused(sidecars):
    sidecar = sidecars("legacy-driver")
    status, body = raw_request(sidecar.socket, method="POST", target="/v1/snapshot")
    assert status == 405 and "read-only" in body["error"]


def test_sigterm_stops_cleanly(tmp_path):
    sidecar = SidecarProcess(tmp_path, "legacy-driver").start()
    assert sidecar.stop() == 0
    assert not (tmp_path / "run" / "sidecar.sock").exists()
    assert "sidecar stopped" in sidecar.log_text()


def test_healthz_command(sidecars, tmp_path, capsys):
    sidecar = sidecars("legacy-driver")
    assert main(["healthz", "--socket", sidecar.socket]) == 0
    assert capsys.readouterr().out.startswith("ok")
    assert main(["healthz", "--socket", str(tmp_path / "nothing.sock")]) == 1


# --- the check in sidecar mode --------------------------------------------------------------


def series_shapes():
    """{(metric, tag keys)}: what a run submitted, without the values."""
    return {
        (name, tuple(sorted(tag_dict(stub.tags))))
        for name in _aggregator.metric_names
        for stub in _aggregator.metrics(name)
    }


def service_check_shapes():
    return {
        (name, sc.status, tuple(sorted(tag_dict(sc.tags))))
        for name in _aggregator._service_checks
        for sc in _aggregator.service_checks(name)
        if name != SIDECAR_CHECK
    }


@pytest.mark.parametrize("scenario", ["faults", "a100-mig", "t4-shared", "legacy-driver", "hpc-slurm", "dgx-h100"])
def test_same_metrics_as_local_mode(sidecars, scenario):
    sidecar = sidecars(scenario)
    local = GpuMonitoringCheck("gpu_monitoring", {}, [{"simulate": scenario}])
    local.start()
    # Both modes ask the same kubelet: the one the local check's simulated node serves.
    kubelet = local.simulated_node.kubelet
    options = {"kubernetes": False}
    if kubelet is not None:
        options = {"kubernetes": True, "kubelet_url": kubelet.url, "kubelet_token_path": kubelet.token_path,
                   "kubelet_ca_path": kubelet.ca_path}
    # The scenario's prices stand in for the local check's hourly_price: the sidecar's check gets them too.
    options["hourly_price"] = local.simulated_node.prices()
    runs = {}
    for mode, check in (("sidecar", sidecar_check(sidecar.socket, **options)), ("local", local)):
        _aggregator.reset()
        for _ in range(2):
            assert check.run() == ""
        runs[mode] = (series_shapes(), service_check_shapes())
        check.cancel()
    assert runs["sidecar"][0] == runs["local"][0]
    assert runs["sidecar"][1] == runs["local"][1]


def test_sidecar_down_is_critical_and_nothing_stale(tmp_path, caplog):
    sidecar = SidecarProcess(tmp_path, "legacy-driver").start()
    check = sidecar_check(sidecar.socket)
    _aggregator.reset()
    assert check.run() == ""
    assert _aggregator.metric_names
    sidecar.stop()
    for _ in range(3):
        _aggregator.reset()
        assert check.run() == ""
        assert _aggregator.metric_names == []
        (state,) = _aggregator.service_checks(SIDECAR_CHECK)
        assert state.status == AgentCheck.CRITICAL and "no sidecar socket" in state.message
    assert sum("Cannot read the sidecar" in r.getMessage() for r in caplog.records) == 1


def test_garbage_on_the_socket_is_critical(tmp_path):
    path = str(tmp_path / "garbage.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    import threading

    def answer():
        for _ in range(2):
            connection, _ = server.accept()
            connection.recv(4096)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!")
            connection.close()

    threading.Thread(target=answer, daemon=True).start()
    check = sidecar_check(path)
    _aggregator.reset()
    assert check.run() == ""
    (state,) = _aggregator.service_checks(SIDECAR_CHECK)
    assert state.status == AgentCheck.CRITICAL and "not JSON" in state.message
    assert _aggregator.metric_names == []
    server.close()


def test_a_sidecar_without_nvml_is_reachable_but_nvml_is_critical(tmp_path):
    library = str(tmp_path / "libnvidia-ml.so.1")
    sidecar = SidecarProcess(tmp_path, None, "--nvml-library-path", library).start(ready=False)
    try:
        status, body = raw_request(sidecar.socket, target="/v1/snapshot")
        assert status == 503 and "libnvidia-ml.so.1" in body["error"]
        check = sidecar_check(sidecar.socket)
        _aggregator.reset()
        assert check.run() == ""
        (nvml,) = _aggregator.service_checks("gpu_monitoring.nvml.can_connect")
        assert nvml.status == AgentCheck.CRITICAL and "on the sidecar" in nvml.message
        (state,) = _aggregator.service_checks(SIDECAR_CHECK)
        assert state.status == AgentCheck.OK
        assert _aggregator.metric_names == []
    finally:
        sidecar.stop()


def test_missing_sidecar_can_be_ignored(tmp_path):
    check = sidecar_check(str(tmp_path / "none.sock"), ignore_missing_sidecar=True)
    _aggregator.reset()
    assert check.run() == ""
    assert _aggregator.metric_names == [] and _aggregator.service_checks(SIDECAR_CHECK) == []


# --- exactly-once events --------------------------------------------------------------------

TIMELINE = """
description: One H100 with an XID every 30 simulated seconds.
driver: {version: "550.90.07", nvml_version: "12.550.90.07", cuda_version: 12040}
devices:
  - name: NVIDIA H100 PCIe
    architecture: hopper
    memory_mib: 81559
    bar1_mib: 131072
    clocks_max: {sm: 1755, memory: 1593, graphics: 1755, video: 1620}
    power_limit_w: 350
    idle_power_w: 48
    slowdown_c: 88
    pcie: {generation: 5, width: 16}
    load: {utilization: 40}
faults:
  - {at: 10, kind: xid, device: 0, xid: 13}
  - {at: 40, kind: xid, device: 0, xid: 31}
  - {at: 70, kind: xid, device: 0, xid: 43}
"""


# These count NVML's events by the journal's seqs; the kernel's log through a sidecar restart is
# tests/test_kernel_record_sidecar.py's.
NVML_ALONE = ("--kernel-log", "none")


def xid_counts():
    return sorted(int(tag_dict(m.tags)["xid"]) for m in _aggregator.metrics("gpu_monitoring.xid_errors")
                  for _ in range(int(m.value)))


@pytest.fixture
def timeline(tmp_path):
    path = tmp_path / "timeline.yaml"
    path.write_text(TIMELINE)
    return str(path)


def test_events_while_the_check_is_stopped_count_once(sidecars, timeline, datadog_agent):
    # 20 simulated seconds per real second: the XIDs come about 0.5, 2 and 3.5 s after start.
    sidecar = sidecars(timeline, "--speed", "20", *NVML_ALONE)
    check = sidecar_check(sidecar.socket)
    _aggregator.reset()
    assert check.run() == ""
    check.cancel()  # the check stops; the sidecar keeps journaling
    wait_until(lambda: sidecar.journal_last_seq() >= 3, 20, "the three XIDs never reached the journal")
    restarted = sidecar_check(sidecar.socket)
    _aggregator.reset()
    assert restarted.run() == ""
    assert xid_counts() == [13, 31, 43]
    assert len(_aggregator.events) == 3
    again = sidecar_check(sidecar.socket)  # another restart: nothing counted twice
    _aggregator.reset()
    assert again.run() == ""
    assert xid_counts() == [] and _aggregator.events == []


def test_a_sidecar_restart_loses_and_duplicates_nothing(tmp_path, timeline, datadog_agent):
    # 5 simulated seconds per real second: XID 13 comes after 2 s, XID 31 would come 6 s later.
    first = SidecarProcess(tmp_path, timeline, "--speed", "5", *NVML_ALONE).start()
    wait_until(lambda: first.journal_last_seq() >= 1, 20, "the first XID never reached the journal")
    check = sidecar_check(first.socket)
    _aggregator.reset()
    assert check.run() == ""
    assert xid_counts() == [13]
    assert first.stop() == 0
    # The node comes back later in its timeline: the XID at t=40 happens after the restart.
    second = SidecarProcess(tmp_path, timeline, "--speed", "20", "--start-at", "30", *NVML_ALONE).start()
    try:
        wait_until(lambda: second.journal_last_seq() >= 3, 20, "the later XIDs never reached the journal")
        _aggregator.reset()
        assert check.run() == ""
        assert xid_counts() == [31, 43]
        page = second.client().events(0, 10)
        assert [e.code for e in page.events] == [13, 31, 43]  # sequence numbers continued across the restart
        assert page.journal_last_seq == 3
    finally:
        second.stop()


def test_a_kernel_log_it_cannot_read_is_told_by_health_and_the_snapshot_not_readiness(sidecars, tmp_path):
    sidecar = sidecars("legacy-driver", "--kernel-log", str(tmp_path / "no-kern.log"))
    status, health = raw_request(sidecar.socket)
    assert health["status"] == "ok" and "cannot read the kernel's log" in health["kernel_log"]
    assert "--kernel-log to none" in health["kernel_log"]
    status, snapshot = raw_request(sidecar.socket, target="/v1/snapshot")
    assert "cannot read the kernel's log" in snapshot["snapshot"]["node"]["kernel_log_problem"]
    (tmp_path / "off").mkdir()
    off = sidecars("legacy-driver", "--kernel-log", "none", directory=tmp_path / "off")
    assert raw_request(off.socket)[1]["kernel_log"] == "off"
