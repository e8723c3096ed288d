"""The check reads a dcgm-exporter (a real HTTP server on 127.0.0.1) on a simulated node whose GPUs
have no GPM: DCGM's activity reaches GPUs and MIG instances, and every fault gives the
dcgm.can_connect service check with its reason, logged once per change, while the run's other
metrics go out."""

import logging
import time

import pytest
from datadog_checks.base import AgentCheck
from datadog_checks.dev.utils import get_service_checks

from gpu_monitoring.dcgm.client import DcgmClient, DcgmError
from gpu_monitoring.dcgm.freshness import Freshness
from gpu_monitoring.dcgm.reader import DcgmReader
from gpu_monitoring.kube.pod_list import parse_pod_list
from gpu_monitoring.snapshot import Device, Node, Snapshot
from gpu_monitoring.status import Status

from .dcgm_support import ExporterServer, exporter_page, pod
from .sidecar_support import wait_until

CAN_CONNECT = "gpu_monitoring.dcgm.can_connect"
# DCGM's values for the a100-mig scenario: GPU instances of GPU 0 and 1, GPU 2 (no MIG) whole.
INSTANCE_ACTIVITY = {2: 0.71, 3: 0.40, 9: 0.15, 10: 0.0}


def a100_mig_page(node, energy=1000, timestamp_ms=None):
    """dcgm-exporter's page for the scenario's GPUs: GPU 0's instances, and GPU 2 whole."""
    devices = node.sim.devices
    entities = [(devices[0].spec.uuid, gi, {"DCGM_FI_PROF_SM_ACTIVE": ratio, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ratio})
                for gi, ratio in INSTANCE_ACTIVITY.items()]
    # Another spelling of the UUID, as DCGM may print it.
    entities.append((devices[2].spec.uuid.upper().replace("GPU-", ""), None,
                     {"DCGM_FI_PROF_SM_ACTIVE": 0.5, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "NaN"}))
    return exporter_page(entities, energy, timestamp_ms)


def status(aggregator):
    checks = aggregator.service_checks(CAN_CONNECT)
    assert len(checks) <= 1
    return (checks[0].status, checks[0].message) if checks else None


def dcgm_logs(caplog):
    return [r.getMessage() for r in caplog.records if "dcgm-exporter" in r.getMessage()]


@pytest.fixture
def exporter():
    with ExporterServer() as server:
        yield server


def test_dcgm_activity_reaches_mig_instances_and_gpus(node, aggregator, exporter):
    a100 = node("a100-mig", dcgm_exporter_url=exporter.url)
    exporter.page = a100_mig_page(a100)
    a100.run(2)
    assert status(aggregator) == (AgentCheck.OK, "")
    sm = a100.instance_values("sm_active")
    assert {gi: sm[0, gi] for gi in INSTANCE_ACTIVITY} == pytest.approx({gi: r * 100 for gi, r in
                                                                          INSTANCE_ACTIVITY.items()})
    assert a100.values("sm_active") == {2: pytest.approx(50.0)}
    assert a100.values("graphics_active") == {}, "GPU 2's graphics engine is not on the page"
    assert a100.values("tensor_active") == {}, "DCGM's NaN is no value"
    assert exporter.connections == 1 and exporter.requests == 2, "one connection kept alive across runs"
    aggregator.assert_service_checks(get_service_checks())


def test_no_service_check_without_an_exporter(node, aggregator):
    node("l4-mixed").run()  # auto: the simulated kubelet lists no exporter
    assert status(aggregator) is None
    node("a100-mig", dcgm_exporter_url="none").run()
    assert status(aggregator) is None


FAULTS = {
    # how the exporter misbehaves -> (status, words of the reason)
    "slow": (AgentCheck.WARNING, "did not answer in time: no complete answer within 0.3s"),
    "garbage": (AgentCheck.CRITICAL, "is no dcgm-exporter page: the answer names no DCGM field"),
    "oversized": (AgentCheck.CRITICAL, "sent too much: the answer is larger than 16 MiB"),
    "redirect": (AgentCheck.CRITICAL, "answered with a redirect (HTTP 302), which is refused"),
    "error": (AgentCheck.CRITICAL, "answered HTTP 503"),
}


@pytest.mark.parametrize("behaviour", FAULTS)
def test_faults(node, aggregator, exporter, caplog, behaviour):
    caplog.set_level(logging.INFO)
    a100 = node("a100-mig", dcgm_exporter_url=exporter.url)
    a100.check.dcgm = DcgmReader(exporter.url, timeout=0.3)
    exporter.page = a100_mig_page(a100)
    exporter.behaviour = behaviour
    exporter.delay = 1.0
    started = time.monotonic()
    a100.run(2)
    expected_status, words = FAULTS[behaviour]
    got_status, message = status(aggregator)
    assert got_status == expected_status and words in message, message
    assert time.monotonic() - started < 2 * 0.3 + 1.5, "each read ends at its deadline"
    assert len(dcgm_logs(caplog)) == 1, "one log line while the fault lasts"
    assert a100.instance_values("sm_active") == {}, "no DCGM value this run"
    assert a100.values("temperature") and a100.values("memory.used"), "the run's other metrics go out"
    aggregator.assert_service_checks(get_service_checks())
    exporter.behaviour = "ok"
    a100.run()
    assert status(aggregator) == (AgentCheck.OK, "")
    assert dcgm_logs(caplog)[-1] == "dcgm-exporter answers again"
    assert a100.instance_values("sm_active")


def test_an_exporter_that_is_down(node, aggregator, caplog):
    caplog.set_level(logging.INFO)
    with ExporterServer() as server:
        url = server.url  # its port, closed once it has stopped
    legacy = node("legacy-driver", dcgm_exporter_url=url)
    legacy.run(3)
    got_status, message = status(aggregator)
    assert got_status == AgentCheck.CRITICAL and f"cannot connect to {url}" in message, message
    assert len(dcgm_logs(caplog)) == 1
    assert legacy.values("temperature"), "the run's other metrics go out"


def test_another_nodes_exporter(node, aggregator, exporter):
    exporter.page = exporter_page([("GPU-00000000-1111-2222-3333-444444444444", None,
                                    {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.5})])
    a100 = node("a100-mig", dcgm_exporter_url=exporter.url)
    a100.run()
    got_status, message = status(aggregator)
    assert got_status == AgentCheck.CRITICAL and "none of this node's GPUs (no UUID matches)" in message
    assert a100.values("graphics_active") == {}


def test_stale_timestamps(node, aggregator, exporter):
    a100 = node("a100-mig", dcgm_exporter_url=exporter.url)
    exporter.page = a100_mig_page(a100, timestamp_ms=int((time.time() - 600) * 1000))
    a100.run()
    got_status, message = status(aggregator)
    assert got_status == AgentCheck.WARNING and "values are more than 90s old" in message, message
    assert a100.instance_values("sm_active") == {}


def test_a_page_that_stands_still_goes_stale(node, aggregator, exporter, caplog):
    caplog.set_level(logging.INFO)
    a100 = node("a100-mig", dcgm_exporter_url=exporter.url)
    exporter.page = a100_mig_page(a100, energy=1000)
    a100.run()
    clock = [time.monotonic()]
    a100.check.dcgm.freshness = Freshness(clock=lambda: clock[0])
    for _ in range(8):  # 15 s apart: over 90 s without a move
        a100.run()
        clock[0] += 15
    got_status, message = status(aggregator)
    assert got_status == AgentCheck.WARNING and "have not changed for over 90s" in message, message
    assert a100.instance_values("sm_active") == {}
    exporter.page = a100_mig_page(a100, energy=1030)
    a100.run()
    assert status(aggregator) == (AgentCheck.OK, "") and a100.instance_values("sm_active")
    assert len(dcgm_logs(caplog)) == 2, "the stale values, then their end"


def test_auto_reads_the_exporter_the_pod_list_names(exporter):
    port = int(exporter.url.split(":")[2].split("/")[0])
    listed = parse_pod_list({"items": [pod("nvidia-dcgm-exporter-x7k2p", ip="127.0.0.1",
                                           ports=({"name": "metrics", "containerPort": port},))]})
    exporter.page = exporter_page([("GPU-1", None, {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.25})])
    reader = DcgmReader("auto")
    snapshot = Snapshot(timestamp=0.0, node=Node(), devices=[Device(index=0, uuid="GPU-1")])
    assert reader.enrich(snapshot, []) is None, "no exporter listed: no service check"
    assert reader.enrich(snapshot, listed) == (Status.OK, None)
    assert snapshot.devices[0].metrics == {"graphics_active": 25.0}
    assert reader.enrich(snapshot, None) == (Status.OK, None), "the kubelet unread: the exporter last found"
    assert exporter.requests == 2 and exporter.connections == 1


def test_a_connection_the_exporter_closed_between_runs_is_opened_again(node, aggregator, exporter, caplog):
    caplog.set_level(logging.INFO)
    exporter.behaviour = "hangup"
    a100 = node("a100-mig", dcgm_exporter_url=exporter.url)
    exporter.page = a100_mig_page(a100)
    a100.run(3)
    assert status(aggregator) == (AgentCheck.OK, "") and dcgm_logs(caplog) == []
    assert exporter.requests == 3 and exporter.connections == 3, "each run on a connection opened again"
    assert a100.instance_values("sm_active")


def test_cancel_closes_the_kept_alive_connection(node, exporter):
    a100 = node("a100-mig", dcgm_exporter_url=exporter.url)
    exporter.page = a100_mig_page(a100)
    a100.run()
    assert exporter.closed == 0, "kept alive between runs"
    a100.check.cancel()
    wait_until(lambda: exporter.closed == 1, 5, "the exporter's connection stays open after cancel()")


def test_a_redirect_is_refused_naming_where_it_points(exporter):
    exporter.behaviour = "redirect"
    with pytest.raises(DcgmError) as refused:
        DcgmClient(exporter.url).read()
    assert refused.value.status == Status.CRITICAL
    assert "it points at http://169.254.169.254/metrics" in str(refused.value)
    assert exporter.requests == 1, "never followed"


def test_one_deadline_bounds_an_answer_that_trickles_in(exporter):
    exporter.behaviour = "trickle"  # 50 ms a byte: each wait well within the deadline
    started = time.monotonic()
    with pytest.raises(DcgmError) as late:
        DcgmClient(exporter.url, timeout=0.3).read()
    assert time.monotonic() - started < 0.6
    assert late.value.status == Status.WARNING and "did not answer in time" in str(late.value)
