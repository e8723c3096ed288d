"""The hgx-b200 board through its timeline: per-link NVLink 5 series, and each fault's health status with
the link, action or reason named, cleared when the timeline clears it.

Timeline (scenario time, runs 15 s apart): link 7 of GPU 5 down from t=10 for 20 s; GPU 2's driver asks
for drain and reset from t=25; GPU 6 loses its fabric registration from t=40 for 20 s.
"""

from datadog_checks.base import AgentCheck

OK, WARNING, CRITICAL = AgentCheck.OK, AgentCheck.WARNING, AgentCheck.CRITICAL
LINKS = 18


def not_ok(node):
    return {index: (stub.status, stub.message) for index, stub in node.health().items() if stub.status != OK}


def test_every_gpu_has_a_series_per_link_in_the_full_profile(node):
    b200 = node("hgx-b200").run(2)  # the tests' nodes send every profile's series
    for metric in ("nvlink.throughput.tx", "nvlink.errors.effective", "nvlink.ber.effective", "nvlink.ber.symbol"):
        ports = b200.link_values(metric)
        assert {gpu for gpu, _ in ports} == set(range(8)), metric
        assert sorted({port for _, port in ports}) == list(range(LINKS)), metric
    assert b200.values("nvlink.links.total") == dict.fromkeys(range(8), LINKS)


def test_the_standard_profile_sends_the_gpu_totals_only(node):
    b200 = node("hgx-b200", metrics_profile="standard").run(2)
    assert b200.link_values("nvlink.throughput.tx") == {}
    assert set(b200.values("nvlink.errors.effective")) == set(range(8))


def test_each_fault_of_the_timeline_is_named_and_clears(node):
    b200 = node("hgx-b200").run(1)
    assert not_ok(b200) == {}

    b200.run_until(15)
    assert not_ok(b200) == {5: (WARNING, "NVLink down: link 7")}
    assert b200.values("nvlink.links.inactive")[5] == 1

    b200.run_until(30)
    status, message = not_ok(b200)[2]
    assert status == CRITICAL and "drain and reset" in message
    assert 5 not in not_ok(b200)  # the link came back at t=30

    b200.run_until(45)
    status, message = not_ok(b200)[6]
    assert status == CRITICAL and "fabric registration" in message

    b200.run_until(75)
    assert not_ok(b200) == {}
