"""Finding this node's dcgm-exporter in the kubelet's pod list, and judging whether its values are fresh."""

import pytest

from gpu_monitoring.dcgm.discovery import exporter_url
from gpu_monitoring.dcgm.exposition import Page, Sample
from gpu_monitoring.dcgm.freshness import STALE_AFTER, Freshness
from gpu_monitoring.kube.pod_list import parse_pod_list

from .dcgm_support import pod


def found(*pods):
    return exporter_url(parse_pod_list({"items": list(pods)}))


OTHER = pod("trainer-0", labels={"app": "trainer"}, image="pytorch/pytorch:2.3", ip="10.244.3.20",
            ports=({"name": "metrics", "containerPort": 8000},), namespace="ml")


def test_the_gpu_operators_exporter_is_found():
    assert found(OTHER, pod("nvidia-dcgm-exporter-x7k2p")) == "http://10.244.3.17:9400/metrics"


@pytest.mark.parametrize("labels", [
    {"app": "nvidia-dcgm-exporter-dra"},
    {"app.kubernetes.io/name": "dcgm-exporter", "app.kubernetes.io/instance": "dcgm"},
])
def test_the_exporters_other_labels(labels):
    assert found(pod("dcgm-exporter-1", labels=labels, image="example.com/exporter:1")) is not None


def test_an_exporter_known_by_its_image_alone():
    assert found(pod("metrics-0", labels={}, image="nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04"))


def test_its_named_metrics_port_else_9400():
    assert found(pod("e", ports=({"name": "metrics", "containerPort": 9500},))) == "http://10.244.3.17:9500/metrics"
    assert found(pod("e", ports=({"name": "http", "containerPort": 8080},))) == "http://10.244.3.17:9400/metrics"
    assert found(pod("e", ports=())) == "http://10.244.3.17:9400/metrics"


def test_an_ipv6_pod_ip_is_bracketed():
    assert found(pod("e", ip="fd00:10:244::17")) == "http://[fd00:10:244::17]:9400/metrics"


@pytest.mark.parametrize("change", [
    {"phase": "Pending"}, {"phase": "Succeeded"}, {"ready": "False"}, {"ip": None},
], ids=["pending", "succeeded", "not ready", "no ip yet"])
def test_only_a_running_ready_pod_serves(change):
    assert found(pod("e", **change)) is None


def test_no_other_pod_is_taken_for_one():
    assert found(OTHER) is None
    assert found() is None


def test_the_first_by_namespace_and_name_of_several():
    assert found(pod("b", ip="10.0.0.2"), pod("a", ip="10.0.0.1")) == "http://10.0.0.1:9400/metrics"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def page(heartbeat, timestamp=None):
    return Page([Sample("1", None, "sm_active", 50.0, timestamp)], tuple(heartbeat))


def test_a_page_whose_heartbeat_stands_still_goes_stale():
    clock = Clock()
    freshness = Freshness(clock=clock)
    for _ in range(4):
        samples, stale = freshness.fresh(page(["energy 100"]))
        assert samples and stale is None
        clock.now += STALE_AFTER / 4
    clock.now += 1
    samples, stale = freshness.fresh(page(["energy 100"]))
    assert samples == [] and "have not changed for over 90s" in stale
    samples, stale = freshness.fresh(page(["energy 130"]))
    assert samples and stale is None, "a page that moves again is trusted at once"


def test_a_page_without_a_heartbeat_is_not_judged_by_it():
    clock = Clock()
    freshness = Freshness(clock=clock)
    for _ in range(5):
        assert freshness.fresh(page([]))[1] is None
        clock.now += STALE_AFTER


def test_timestamps_older_than_three_sample_periods_are_not_trusted():
    wall = Clock()
    freshness = Freshness(wall=wall)
    assert freshness.fresh(page(["e 1"], timestamp=wall.now - 10))[0]
    samples, stale = freshness.fresh(page(["e 2"], timestamp=wall.now - STALE_AFTER - 1))
    assert samples == [] and "more than 90s old" in stale
    fresh_and_old = Page([Sample("1", None, "sm_active", 1.0, wall.now), Sample("2", None, "sm_active", 1.0, 0.0)])
    assert [s.gpu_uuid for s in freshness.fresh(fresh_and_old)[0]] == ["1"], "an old sample alone is left out"
