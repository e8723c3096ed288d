"""The check's way into the aggregator hands over exactly what `AgentCheck.gauge`, `monotonic_count`
and `count` would: the same names, values, tags and types, with the namespace, `metric_patterns`,
the metric limiter, `disable_generic_tags` and the base class's handling of odd tags and values."""

from itertools import groupby
from typing import List, Tuple

import pytest
from datadog_checks.base import AgentCheck

from gpu_monitoring.metrics.spec import SPEC
from gpu_monitoring.submission.metric_sink import MetricSink

GPU = ["gpu_uuid:gpu-1", "gpu_index:0", "host:gpu-node-3", "device:nvidia0", "service:training"]
SERIES = [
    ("utilization.gpu", 87, GPU),
    ("utilization.memory", 41.5, GPU),
    ("utilization.encoder", 0, GPU),
    ("energy.consumed", 123456, GPU),
    ("pcie.aer.corrected", 2, GPU + ["pcie_link:0000:18:00.0"]),
    ("utilization.gpu", 12, GPU[:2] + ["pid:4242", None, b"process_name:python"]),
    ("utilization.gpu", 33.0, []),
    # The same tag list again, after others: kept answers must not leak between lists.
    ("utilization.memory", 40.0, GPU),
    ("energy.consumed", 123999, GPU),
]


class Probe(AgentCheck):
    __NAMESPACE__ = "gpu_monitoring"

    def check(self, _instance) -> None:
        pass


def through_base(check: AgentCheck, series) -> None:
    by_type = {"gauge": check.gauge, "monotonic_count": check.monotonic_count, "count": check.count}
    for name, value, tags in series:
        by_type[SPEC[name].type](name, value, tags=tags)


def through_sink(check: AgentCheck, series) -> None:
    sink = MetricSink(check)
    routes = sink.routes({name for name, _, _ in series})
    for _ in range(2):  # answers kept from a first run serve the second as the base class would answer
        sink.open()
        # A run of series under one tag list goes together, as a GPU's do; in order, as the limiter counts.
        for _, run in groupby(series, key=lambda one: id(one[2])):
            run = list(run)
            sink.submit_all([(routes[name], value) for name, value, _ in run if name in routes], run[0][2])


def received(aggregator, send, instance) -> List[Tuple]:
    aggregator.reset()
    check = Probe("gpu_monitoring", {}, [dict(instance)])
    send(check, SERIES + SERIES if send is through_base else SERIES)
    return sorted((m.name, m.type, m.value, tuple(m.tags), m.hostname, m.flush_first_value)
                  for name in aggregator.metric_names for m in aggregator.metrics(name))


@pytest.mark.parametrize("instance", [
    {},
    {"metric_patterns": {"include": ["^gpu_monitoring\\.utilization"], "exclude": ["encoder"]}},
    {"metric_patterns": {"exclude": ["energy"]}},
    {"disable_generic_tags": True},
    # The limiter counts a gauge or monotonic count at each call, a count by its context.
    {"max_returned_metrics": 5},
    {"max_returned_metrics": 13},
], ids=["plain", "include-exclude", "exclude", "generic-tags", "limit-5", "limit-13"])
def test_the_sink_hands_over_what_the_base_class_does(aggregator, instance, monkeypatch):
    # Generic tags (`host`, `device`) are what `disable_generic_tags` renames; the stub refuses them unless told.
    monkeypatch.setenv("DDEV_SKIP_GENERIC_TAGS_CHECK", "1")
    expected = received(aggregator, through_base, instance)
    assert expected  # every case sends something
    assert received(aggregator, through_sink, instance) == expected


def test_a_value_that_is_no_number_fails_as_in_the_base_class(aggregator):
    check = Probe("gpu_monitoring", {}, [{}])
    sink = MetricSink(check)
    sink.open()
    with pytest.raises(ValueError, match="non float value") as ours:
        sink.submit(sink.routes({"utilization.gpu"})["utilization.gpu"], "high", GPU)
    with pytest.raises(ValueError) as theirs:
        check.gauge("utilization.gpu", "high", tags=GPU)
    assert str(ours.value) == str(theirs.value)


def test_a_tag_list_changed_in_place_is_normalized_anew(aggregator):
    # What is kept is keyed by the tags themselves, not by the list that held them.
    check = Probe("gpu_monitoring", {}, [{}])
    sink = MetricSink(check)
    route = sink.routes({"utilization.gpu"})["utilization.gpu"]
    sink.open()
    tags = ["gpu_index:0"]
    sink.submit(route, 1, tags)
    tags.append("pid:7")
    sink.submit(route, 2, tags)
    assert [m.tags for m in aggregator.metrics("gpu_monitoring.utilization.gpu")] == [
        ["gpu_index:0"], ["gpu_index:0", "pid:7"]]
