"""Where the GPU-hours go: a GPU's price splits into its workloads' shares and the capacity nobody holds,
in the grain it is shared (MIG slices, advertised replicas, whole), and a GPU the node cannot use is
priced apart. The figures are sums of the same parts on every scenario; the expected parts are
computed here from the scenario files, not taken from the check.
"""

import re

import pytest

from gpu_monitoring.cli.main import main
from gpu_monitoring.cli.status import CRITICAL_FOUND
from gpu_monitoring.simulator.scenario import available
from tests.test_demo_cost import device_prices, scenario

SLICES = re.compile(r"^(\d+)g\.")


def total(simulated, metric):
    return sum(stub.value for stub in simulated.series(metric))


@pytest.mark.parametrize("name", available())
def test_node_cost_is_its_workloads_and_unallocated_capacity(node, name):
    simulated = node(name).run()
    unallocated = total(simulated, "fleet.cost.unallocated_hourly")
    gpus = simulated.values("cost.hourly")
    assert sum(gpus.values()) == pytest.approx(total(simulated, "workload.cost.hourly") + unallocated)
    assert sum(simulated.values("cost.idle_hourly").values()) == pytest.approx(
        total(simulated, "workload.cost.idle_hourly") + unallocated)
    # The same capacity in GPU-equivalents: the GPUs less what workloads hold.
    assert total(simulated, "fleet.capacity.unallocated") == pytest.approx(
        len(gpus) - total(simulated, "workload.gpus"))


def held_slices(raw, index):
    """The compute slices of a MIG GPU's instances that the scenario's pods were given."""
    refs = {ref for pod in raw["kubernetes"]["pods"] for c in pod["containers"] for ref in c.get("devices", [])}
    held = {int(ref.split("/")[1]) for ref in refs if ref.startswith((f"mig:{index}/", f"mig-legacy:{index}/"))}
    return sum(int(SLICES.match(m["profile"]).group(1)) for m in raw["devices"][index]["mig"] if m["gi"] in held)


def test_free_mig_slices_are_idle_at_their_share_of_the_price(node):
    raw = scenario("a100-mig")
    prices = device_prices(raw)
    mig = [i for i, d in enumerate(raw["devices"]) if d.get("mig")]
    free = {i: (7 - held_slices(raw, i)) / 7 for i in mig}
    assert sum(free.values()) == pytest.approx(2 / 7), "two 1g.10gb slices are given to no pod"
    simulated = node("a100-mig").run()
    assert total(simulated, "fleet.capacity.unallocated") == pytest.approx(sum(free.values()))
    free_cost = sum(prices[i] * f for i, f in free.items())
    assert total(simulated, "fleet.cost.unallocated_hourly") == pytest.approx(free_cost)
    # Slices given to a pod that runs nothing on them are idle too: triton-4 holds GPU 1's GI 11.
    idle = simulated.values("cost.idle_hourly")
    assert idle[1] == pytest.approx(prices[1] * (free[1] + 1 / 7))


def test_free_replicas_of_a_shared_gpu_are_unallocated(node):
    raw = scenario("t4-shared")
    prices = device_prices(raw)
    advertised = {a["device"]: a["replicas"] for a in raw["kubernetes"]["advertised"]}
    held = {0: 0, 1: 0}
    for pod in raw["kubernetes"]["pods"]:
        for ref in (r for c in pod["containers"] for r in c.get("devices", [])):
            held[int(ref.split(":")[1])] += 1
    simulated = node("t4-shared").run()
    # GPU 0's replicas are the advertised ones; GPU 1's, unadvertised, are bounded by the IDs held.
    free = (advertised[0] - held[0]) / advertised[0]
    assert total(simulated, "fleet.cost.unallocated_hourly") == pytest.approx(prices[0] * free)


def test_a_mig_gpu_held_by_one_slice_leaves_the_rest_unallocated(node):
    prices = device_prices(scenario("dra-h100"))
    simulated = node("dra-h100").run()
    assert simulated.values("cost.idle_hourly")[3] == pytest.approx(prices[3] * 6 / 7)


def test_a_gpu_on_the_bus_that_nvml_does_not_list_is_priced_as_its_model(node, capsys):
    raw = scenario("gpu-missing")
    price = device_prices(raw)[0]
    simulated = node("gpu-missing").run()
    assert total(simulated, "fleet.devices.unusable") == 1
    assert total(simulated, "fleet.cost.unusable_hourly") == pytest.approx(price)
    assert main(["check", "--simulate", "gpu-missing"]) == CRITICAL_FOUND  # the node is CRITICAL for it
    out = " ".join(capsys.readouterr().out.split())
    listed = len(raw["devices"])
    assert f"Node: {listed} of {listed + 1} GPUs usable" in out
    assert f"unusable ${price:,.2f}/h" in out


def test_the_summary_says_what_nobody_holds(capsys):
    raw = scenario("a100-mig")
    assert main(["check", "--simulate", "a100-mig"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    prices = device_prices(raw)
    free = sum(prices[i] * (7 - held_slices(raw, i)) / 7 for i, d in enumerate(raw["devices"]) if d.get("mig"))
    assert f"(unallocated ${free:,.2f}/h)" in out
