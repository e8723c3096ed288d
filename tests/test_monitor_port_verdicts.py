"""The network port monitors say what the check says. Their queries, evaluated on the series the check
submitted run after run, alert on exactly the ports `node.health` names: below the rate it expects of
them (HDR InfiniBand at 200 Gb/s judged by its peers, RoCE by its own, or every port by
`expected_network_rate`) or down; never on a port left out, nor on one with no peers to judge its rate by.
"""

import json
import re
from typing import Dict, List, Set

import pytest
from datadog_checks.base.stubs import aggregator as stub_aggregator

from .assets_support import ASSETS, ASSETS_PROFILE
from .conftest import H100_PCIE_NODE
from .monitor_eval import alerting

NODE_HEALTH = "gpu_monitoring.node.health"
# A node that is none of NVIDIA's reference systems, so `auto` fixes no rate: four HDR InfiniBand ports
# (200 Gb/s, "4X HDR" in the kernel's sysfs `rate` file) for the compute fabric and three RoCE ports
# at 100 GbE for storage. From t=20 one HDR port retrains at EDR (100 Gb/s), another is down, and a
# RoCE port runs at 25 GbE.
HDR_AND_ROCE = H100_PCIE_NODE + """
description: Four H100 PCIe, four HDR InfiniBand ports and three RoCE ports, three of them faulty from t=20.
devices:
  - {model: h100}
  - {model: h100}
  - {model: h100}
  - {model: h100}
node:
  network:
    - {device: mlx5_0, pci: "0000:81:00.0", rate: 200}
    - {device: mlx5_1, pci: "0000:82:00.0", rate: 200}
    - {device: mlx5_2, pci: "0000:83:00.0", rate: 200}
    - {device: mlx5_3, pci: "0000:84:00.0", rate: 200}
    - {device: mlx5_4, pci: "0000:91:00.0", link_layer: Ethernet, rate: 100}
    - {device: mlx5_5, pci: "0000:91:00.1", link_layer: Ethernet, rate: 100}
    - {device: mlx5_6, pci: "0000:92:00.0", link_layer: Ethernet, rate: 100}
faults:
  - {at: 20, kind: port_slow, port: mlx5_1/1, rate: 100}
  - {at: 20, kind: port_down, port: mlx5_2/1}
  - {at: 20, kind: port_slow, port: mlx5_5/1, rate: 25}
"""
# What node.health says of a port, by the monitor that must say the same.
REASONS = {
    "gpu_network_port_slow.json": re.compile(r"port (\S+/\d+) (?:\(\S+\) )?runs at [\d.]+ Gb/s, below"),
    "gpu_network_port_down.json": re.compile(r"port (\S+/\d+) (?:\(\S+\) )?is down"),
}


def _query(monitor: str) -> str:
    return json.loads((ASSETS / "monitors" / monitor).read_text())["definition"]["query"]


def _ports(groups: Set[tuple], monitor: str) -> Set[str]:
    """The ports (device/port) of a monitor's alerting groups."""
    by = re.search(r"\bby \{([^}]*)\}", _query(monitor))[1].split(",")
    return {f"{dict(zip(by, group))['ib_device']}/{dict(zip(by, group))['ib_port']}" for group in groups}


def _runs(node, scenario, until: float, **options) -> List[dict]:
    """Each run's series ({metric: [(tags, value)]}) and node.health message, the assets' profile sent."""
    simulated = node(scenario, metrics_profile=ASSETS_PROFILE, **options)
    runs = []
    while not runs or simulated.now < until:
        simulated.run()
        series = {name: [(stub.tags, stub.value) for stub in stub_aggregator.metrics(name)]
                  for name in stub_aggregator.metric_names}
        (health,) = stub_aggregator.service_checks(NODE_HEALTH)
        runs.append({"t": simulated.now, "series": series, "health": health.message or ""})
    return runs


def _judged(run: dict, monitor: str) -> Set[str]:
    return set(REASONS[monitor].findall(run["health"]))


@pytest.fixture
def hdr_and_roce(tmp_path):
    path = tmp_path / "hdr-roce.yaml"
    path.write_text(HDR_AND_ROCE)
    return path


OPTIONS = {
    "peers": ({}, {"mlx5_1/1", "mlx5_5/1"}),
    "rate set": ({"expected_network_rate": 200}, {"mlx5_1/1", "mlx5_4/1", "mlx5_5/1", "mlx5_6/1"}),
    # The slow RoCE port left alone has no peers to judge its rate by: neither the check nor the monitor judges it.
    "peers excluded": ({"network_ports_exclude": ["mlx5_4", "mlx5_6"]}, {"mlx5_1/1"}),
}


@pytest.mark.parametrize("options, slow", OPTIONS.values(), ids=OPTIONS.keys())
def test_the_port_monitors_alert_where_node_health_judges(node, hdr_and_roce, options, slow):
    runs = _runs(node, hdr_and_roce, 45, **options)
    assert _judged(runs[-1], "gpu_network_port_slow.json") == slow
    assert _judged(runs[-1], "gpu_network_port_down.json") == {"mlx5_2/1"}
    for monitor in REASONS:
        for run in runs:
            assert _ports(alerting(_query(monitor), [run["series"]]), monitor) == _judged(run, monitor), \
                (monitor, run["t"])
        # Over the window of the runs since the faults, as the monitor reads them.
        since = [run["series"] for run in runs if run["t"] > 20]
        assert _ports(alerting(_query(monitor), since), monitor) == _judged(runs[-1], monitor), monitor


@pytest.mark.parametrize("scenario, until", [("dgx-h100", 15), ("gpu-missing", 15), ("faults", 90)])
def test_the_port_monitors_agree_with_node_health_on_the_stock_scenarios(node, scenario, until):
    for run in _runs(node, scenario, until):
        for monitor in REASONS:
            assert _ports(alerting(_query(monitor), [run["series"]]), monitor) == _judged(run, monitor), \
                (scenario, monitor, run["t"])


def test_the_expected_rate_is_sent_for_each_port_the_check_judges(node, hdr_and_roce):
    series: Dict[str, float] = {}
    for tags, value in _runs(node, hdr_and_roce, 30)[-1]["series"]["gpu_monitoring.network.port.expected_rate"]:
        found = dict(tag.split(":", 1) for tag in tags)
        series[f"{found['ib_device']}/{found['ib_port']} {found['link_layer']}"] = value
    # Each link layer by its own peers: HDR InfiniBand at 200, RoCE at 100; the down port keeps its expectation.
    assert series == {"mlx5_0/1 infiniband": 200.0, "mlx5_1/1 infiniband": 200.0, "mlx5_2/1 infiniband": 200.0,
                      "mlx5_3/1 infiniband": 200.0, "mlx5_4/1 ethernet": 100.0, "mlx5_5/1 ethernet": 100.0,
                      "mlx5_6/1 ethernet": 100.0}
