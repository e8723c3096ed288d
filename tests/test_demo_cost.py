"""The demo shows what GPUs and their idle time cost: the simulated scenarios carry hourly prices
for their GPU models, the check uses them unless the instance sets its own, and
`gpu-monitoring check` prints cost per GPU, for the node and per workload.

Expected amounts are computed here from the scenario files, not taken from the check.
"""

import re
from pathlib import Path

import pytest
import yaml

from gpu_monitoring import simulator
from gpu_monitoring.cli.main import main
from gpu_monitoring.simulator.scenario import available

SCENARIOS = Path(simulator.__file__).parent / "scenarios"


def scenario(name):
    return yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())


def device_prices(raw):
    """Each device's price by index, from its model's hourly_price."""
    return [raw["models"][device["model"]]["hourly_price"] for device in raw["devices"]]


def running_pods(raw):
    return [pod for pod in raw["kubernetes"]["pods"] if pod.get("phase", "Running") == "Running"]


def idle_devices(raw):
    """The devices no running pod keeps busy: held by none, or by a container running no process there."""
    busy = {int(ref.split(":")[1]) for pod in running_pods(raw) for c in pod["containers"] if c.get("processes")
            for ref in c.get("devices", [])}
    return [i for i in range(len(raw["devices"])) if i not in busy]


def money(value):
    return f"${value:,.2f}/h"


def demo(capsys, *args):
    assert main(["check", "--simulate", "dgx-h100", *args]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", available())
def test_every_scenario_prices_its_gpus(node, name):
    raw = scenario(name)
    prices = device_prices(raw)
    assert all(isinstance(p, (int, float)) and 0 < p < 20 for p in prices), prices
    simulated = node(name).run()
    assert simulated.values("cost.hourly") == dict(enumerate(prices))


def test_the_demo_prints_cost_per_gpu_and_for_the_node(capsys):
    raw = scenario("dgx-h100")
    prices = device_prices(raw)
    idle = idle_devices(raw)
    assert idle, "the demo has idle GPUs to show what they cost"
    out = demo(capsys)
    rows = {line.split()[0]: line for line in out.split("=== GPUs")[1].splitlines()[2:] if line[:1].isdigit()}
    assert set(rows) == {str(i) for i in range(len(prices))}
    for index, price in enumerate(prices):
        idle_cost = price if index in idle else 0
        assert re.findall(r"\$[\d,.]+/h", rows[str(index)]) == [money(price), money(idle_cost)], rows[str(index)]
    total, idle_total = sum(prices), sum(prices[i] for i in idle)
    assert f"cost {money(total)}, idle {money(idle_total)}" in out


def test_the_demo_prints_each_workloads_cost(capsys):
    raw = scenario("dgx-h100")
    prices = device_prices(raw)
    out = demo(capsys).split("=== Workload cost")[1].split("\n\n")[0]
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:] if line.strip()}
    pods = running_pods(raw)  # a finished pod holds nothing
    assert len(rows) == len(pods)
    for pod in pods:
        held = [int(ref.split(":")[1]) for c in pod["containers"] for ref in c["devices"]]
        gpus, cost, _ = rows[f"{pod['namespace']}/{pod['name']}"]
        assert (float(gpus), cost) == (len(held), money(sum(prices[i] for i in held)))


def test_the_instances_hourly_price_wins(capsys, tmp_path):
    own = 1.25
    config = tmp_path / "conf.yaml"
    config.write_text(yaml.safe_dump({"instances": [{"hourly_price": {"NVIDIA H100*": own}}]}))
    out = demo(capsys, "--config", str(config))
    count = len(scenario("dgx-h100")["devices"])
    assert f"cost {money(own * count)}, idle" in out
    assert money(device_prices(scenario("dgx-h100"))[0]) not in out


def test_without_prices_the_demo_says_how_to_set_them(capsys, tmp_path):
    config = tmp_path / "conf.yaml"
    config.write_text(yaml.safe_dump({"instances": [{"hourly_price": {}}]}))
    out = demo(capsys, "--config", str(config))
    assert "set hourly_price or default_hourly_price" in out
    assert "=== Workload cost" not in out


def test_a_default_price_alone_prices_only_models_the_scenario_does_not(node):
    # default_hourly_price is for models hourly_price does not name; the scenario names its own.
    simulated = node("dgx-h100", default_hourly_price=9.0).run()
    assert set(simulated.values("cost.hourly").values()) == set(device_prices(scenario("dgx-h100")))
