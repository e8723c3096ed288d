"""NVLink-C2C links of a Grace Hopper GPU: count, status and error counters, per link and in total.

Scenario gh200 (driver 580): one GH200 with 10 C2C links; at t=20 link 3 counts one replay.
"""

import yaml
from datadog_checks.base import AgentCheck

from gpu_monitoring.health.device_health import evaluate
from gpu_monitoring.simulator.scenario import resolve
from gpu_monitoring.snapshot import Device

LINKS = 10


def per_link(node, metric):
    return node.keyed(metric, lambda t: int(t["c2c_link"]) if "c2c_link" in t else None)


def test_links_and_a_replay(node):
    grace = node("gh200").run_until(15)
    assert grace.values("c2c.links.total") == {0: LINKS}
    assert grace.values("c2c.links.active") == {0: LINKS}
    assert per_link(grace, "c2c.links.active") == dict.fromkeys(range(LINKS), 1)
    assert grace.values("c2c.errors.replay") == {0: 0}
    grace.run_until(30)
    assert grace.values("c2c.errors.replay") == {0: 1}
    assert per_link(grace, "c2c.errors.replay") == {link: int(link == 3) for link in range(LINKS)}
    assert grace.values("c2c.errors.interrupt") == {0: 0} and grace.values("c2c.errors.replay.b2b") == {0: 0}
    assert grace.statuses() == {0: AgentCheck.OK}


def test_a_gpu_without_c2c_sends_none(node):
    dgx = node("dgx-h100").run(1)
    assert dgx.values("c2c.links.total") == {}
    assert not any(name for name in dgx.check.source.reader._readings.values()
                   for name, _ in name.wanted if name.startswith("c2c"))


def test_a_driver_before_r575_gives_status_but_no_error_counters(node, tmp_path):
    scenario = yaml.safe_load(resolve("gh200").read_text())
    scenario["driver"]["version"] = "570.133.20"
    path = tmp_path / "gh200-570.yaml"
    path.write_text(yaml.safe_dump(scenario))
    grace = node(str(path)).run(2)
    assert grace.values("c2c.links.active") == {0: LINKS}
    assert grace.values("c2c.errors.replay") == {}
    assert per_link(grace, "c2c.errors.replay") == {}


def test_a_c2c_link_down_is_a_warning_naming_it():
    health = evaluate(Device(index=0, uuid="GPU-1", c2c_down=[4]), None, [])
    assert health.status == AgentCheck.WARNING
    assert health.message == "NVLink-C2C down: link 4 (the GPU's link to its Grace CPU)"
