"""PCIe throughput from the best source each GPU has: GPM's interval average on Hopper, 64-bit byte
counters where a driver keeps them, else the 20 ms sampling query. A real H100 on driver 580
answers the byte counters in 32 bits, which wrap many times an interval under load."""

import logging

import pynvml
import yaml

from gpu_monitoring.simulator.scenario import resolve

from .conftest import H100_PCIE_NODE

SAMPLING = "nvmlDeviceGetPcieThroughput"
BYTE_FIELDS = (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
GPUS = range(8)
BUSY = [0, 1, 2, 3, 4, 6]
# dgx-h100's devices move 12 GB/s in and 7.2 GB/s out at full load (KiB counted as 1000 bytes there).
FULL_RX = 12e9 * 1024 / 1000


def variant(tmp_path, **model):
    """dgx-h100 without Kubernetes, its GPU model changed by `model`."""
    raw = yaml.safe_load(resolve("dgx-h100").read_text())
    raw.pop("kubernetes")
    raw["models"]["h100-sxm5"].update(model)
    path = tmp_path / "dgx-variant.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def byte_fields_asked(simulated):
    return sum(n for (_, field), n in simulated.sim.field_requests.items() if field in BYTE_FIELDS)


def assert_loaded_rates(simulated):
    tx, rx = simulated.values("pcie.throughput.tx"), simulated.values("pcie.throughput.rx")
    assert set(tx) == set(rx) == set(GPUS)
    # GPU 0 runs near 88 % busy; transmit is 60 % of receive.
    assert 0.7 * FULL_RX < rx[0] < FULL_RX
    assert abs(tx[0] / rx[0] - 0.6) < 0.02
    for index in (5, 7):
        assert tx[index] == rx[index] == 0


def test_hopper_reads_gpm_and_never_asks_the_byte_counters(node):
    dgx = node("dgx-h100").run()
    # The first run has one GPM sample, not a rate: the sampling query stands in, once.
    assert set(dgx.values("pcie.throughput.rx")) == set(GPUS)
    assert dgx.sim.calls[SAMPLING] == 2 * 8
    dgx.sim.calls.clear()
    dgx.run(2)
    assert_loaded_rates(dgx)
    assert dgx.sim.calls[SAMPLING] == 0
    assert byte_fields_asked(dgx) == 0


def test_gpm_rate_is_the_counters_average_over_the_interval(node, tmp_path):
    gpm = node("dgx-h100").run(3)
    counters = node(variant(tmp_path, gpm=False, pcie_counter_bits=64)).run(3)
    for direction in ("tx", "rx"):
        metric = f"pcie.throughput.{direction}"
        from_gpm, from_counters = gpm.values(metric), counters.values(metric)
        for index in BUSY:
            assert abs(from_gpm[index] / from_counters[index] - 1) < 1e-6, (direction, index)


def test_64_bit_counters_give_the_rate_without_sampling(node, tmp_path):
    counted = node(variant(tmp_path, gpm=False, pcie_counter_bits=64)).run()
    assert counted.values("pcie.throughput.tx") == {}  # a rate needs two readings
    counted.sim.calls.clear()
    counted.run(2)
    assert_loaded_rates(counted)
    assert counted.sim.calls[SAMPLING] == 0


def test_32_bit_counters_are_left_for_the_sampling_query(node, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gpu_monitoring")
    narrow = node(variant(tmp_path, gpm=False)).run()
    asked_first = byte_fields_asked(narrow)
    assert asked_first == 2 * 8
    assert sum("32-bit counter" in r.getMessage() for r in caplog.records) == 2 * 8
    narrow.sim.calls.clear()
    narrow.run(2)
    # Sampled each run (two directions a GPU); the counters are not asked again.
    assert byte_fields_asked(narrow) == asked_first
    assert narrow.sim.calls[SAMPLING] == 2 * 2 * 8
    rx = narrow.values("pcie.throughput.rx")
    assert set(rx) == set(GPUS) and 0.7 * FULL_RX < rx[0] < FULL_RX


def test_without_the_gpm_collector_hopper_falls_back_to_sampling(node):
    dgx = node("dgx-h100", disabled_collectors=["gpm"]).run()
    dgx.sim.calls.clear()
    dgx.run(2)
    assert dgx.values("sm_active") == {}
    assert dgx.sim.calls[SAMPLING] == 2 * 2 * 8
    assert set(dgx.values("pcie.throughput.tx")) == set(GPUS)


def test_without_the_pcie_collector_gpm_asks_no_pcie_metric(node):
    dgx = node("dgx-h100", disabled_collectors=["pcie"]).run(2)
    assert dgx.values("sm_active") and dgx.values("pcie.throughput.tx") == {}
    assert dgx.sim.calls[SAMPLING] == 0


def test_mig_instances_have_no_pcie_throughput_of_their_own(node, tmp_path):
    scenario = tmp_path / "h100-mig.yaml"
    scenario.write_text(H100_PCIE_NODE + """
devices:
  - model: h100
    mig:
      - {profile: 3g.40gb, gi: 1, memory_mib: 40192, utilization: 80, processes: [{pid: 11, memory_mib: 30000}]}
""")
    mig = node(str(scenario)).run(3)
    assert mig.instance_values("sm_active")  # GPM answers for the instance...
    assert mig.instance_values("pcie.throughput.tx") == {}  # ...but PCIe is the whole GPU's
    assert set(mig.values("pcie.throughput.tx")) == {0}
