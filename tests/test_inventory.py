"""Inventory for drift across a fleet: each GPU's VBIOS version and persistence mode, read through
pynvml from the simulated driver as seldom as they can change, and the node.info and
device.persistence_mode series made of them."""

from contextlib import contextmanager

import pytest

from gpu_monitoring.collectors.inventory import PERSISTENCE_INTERVAL, Inventory
from gpu_monitoring.collectors.node_reader import NodeReader
from gpu_monitoring.collectors.series import store
from gpu_monitoring.metrics.profile import Profile
from gpu_monitoring.nvml.fields import Values
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import load as load_scenario
from gpu_monitoring.snapshot import Device, Node, Snapshot
from gpu_monitoring.submission.inventory import submit_inventory

from .conftest import H100_PCIE_NODE

VBIOS_CALL, PERSISTENCE_CALL = "nvmlDeviceGetVbiosVersion", "nvmlDeviceGetPersistenceMode"
# Three H100 PCIe: the Hopper default VBIOS with persistence on; its own VBIOS with persistence off;
# a GPU whose driver refuses both calls.
MIXED_NODE = H100_PCIE_NODE + f"""devices:
  - model: h100
  - model: h100
    vbios: "96.00.74.00.11"
    persistence_mode: false
  - model: h100
    unsupported: [{VBIOS_CALL}, {PERSISTENCE_CALL}]
"""


class Clock:
    """Seconds the collector times persistence mode by, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextmanager
def started(scenario):
    """A started NVML session on the simulated driver of `scenario` (a name or a YAML path)."""
    sim = SimulatedNvml(load_scenario(scenario), SimClock(speed=0))
    session = NvmlSession(sim.library)
    session.start()
    try:
        yield sim, session
    finally:
        session.stop()


def collect(collector, session):
    """One run of the collector over the session's GPUs: the snapshot devices it filled."""
    collector.begin_run()
    found = []
    for device in session.devices:
        out = Device(index=device.index, uuid=None)
        store(collector.collect(device, Values()), out)
        found.append(out)
    return found


def reader_of(sim):
    """A node run on the simulated driver with one inventory collector: this module's, in place of
    any the run builds itself."""
    reader = NodeReader(NvmlSession(sim.library), disabled={"inventory"}, proc_root=None, watch_events=False)
    reader.collectors.append(Inventory())
    return reader


def facts(devices):
    return [(device.vbios_version, device.persistence_mode) for device in devices]


@pytest.fixture
def mixed(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED_NODE)
    with started(str(path)) as (sim, session):
        yield sim, session


def test_vbios_and_persistence_mode_come_from_the_driver(mixed):
    _, session = mixed
    # As the driver writes them (hexadecimal fields upper case); refused calls give nothing.
    assert facts(collect(Inventory(Clock()), session)) == [
        ("96.00.74.00.0D", True), ("96.00.74.00.11", False), (None, None)]


@pytest.mark.parametrize("scenario, vbios", [
    ("gh200", ["96.00.8D.00.03"]),  # its model's own
    ("hgx-b200", ["97.00.C5.00.2F"] * 8),  # Blackwell's: the model names none
    ("legacy-driver", ["88.00.4F.00.09", "86.04.26.00.36"]),  # Volta's, Pascal's
])
def test_a_models_vbios_or_else_its_architectures(scenario, vbios):
    with started(scenario) as (_, session):
        found = facts(collect(Inventory(Clock()), session))
    assert found == [(version, True) for version in vbios]


def test_a_steady_run_asks_nvml_nothing(mixed):
    sim, session = mixed
    inventory = Inventory(Clock())
    first = facts(collect(inventory, session))
    # Once each per GPU, the GPU that refuses included: a refusal is not asked again.
    assert (sim.calls[VBIOS_CALL], sim.calls[PERSISTENCE_CALL]) == (3, 3)
    sim.calls.clear()
    for _ in range(5):
        sim.advance(15)
        # Every snapshot carries the facts, read or not.
        assert facts(collect(inventory, session)) == first
    assert sim.calls[VBIOS_CALL] == sim.calls[PERSISTENCE_CALL] == 0


def test_persistence_mode_is_read_again_after_the_interval(mixed):
    sim, session = mixed
    clock = Clock()
    inventory = Inventory(clock)
    collect(inventory, session)
    # `nvidia-smi -pm` while the driver runs: GPU 0 off, GPU 1 on.
    sim.devices[0].spec.facts["persistence_mode"] = False
    sim.devices[1].spec.facts["persistence_mode"] = True
    sim.calls.clear()
    clock.now += PERSISTENCE_INTERVAL - 1
    assert [mode for _, mode in facts(collect(inventory, session))] == [True, False, None]
    assert sim.calls[PERSISTENCE_CALL] == 0
    clock.now += 1
    assert [mode for _, mode in facts(collect(inventory, session))] == [False, True, None]
    # The two GPUs that answer; the VBIOS is not read again.
    assert (sim.calls[PERSISTENCE_CALL], sim.calls[VBIOS_CALL]) == (2, 0)


def test_a_driver_without_the_functions_leaves_the_facts_unknown(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(f"missing_functions: [{VBIOS_CALL}, {PERSISTENCE_CALL}]\n" + H100_PCIE_NODE
                    + "devices:\n  - model: h100\n")
    clock = Clock()
    inventory = Inventory(clock)
    with started(str(path)) as (sim, session):
        assert facts(collect(inventory, session)) == [(None, None)]
        clock.now += PERSISTENCE_INTERVAL
        assert facts(collect(inventory, session)) == [(None, None)]
        # pynvml found no symbol (FUNCTION_NOT_FOUND) once: the device asks no more.
        assert session.devices[0].refused_functions() == [PERSISTENCE_CALL, VBIOS_CALL]
    assert sim.failures == []


def test_nothing_is_read_where_the_metrics_profile_sends_neither(mixed):
    sim, session = mixed
    inventory = Inventory(Clock(), Profile("essential"))
    assert facts(collect(inventory, session)) == [(None, None)] * 3
    assert sim.calls[VBIOS_CALL] == sim.calls[PERSISTENCE_CALL] == 0


def test_the_node_run_puts_both_in_the_snapshot_and_reads_again_after_a_restart():
    sim = SimulatedNvml(load_scenario("gh200"), SimClock(speed=0))
    reader = reader_of(sim)
    try:
        taken = reader.read()
        reader.read()
        assert (sim.calls[VBIOS_CALL], sim.calls[PERSISTENCE_CALL]) == (1, 1)
        # A new session (a driver reload, a lost GPU found again) can find a new VBIOS.
        reader.restart()
        reader.read()
        assert (sim.calls[VBIOS_CALL], sim.calls[PERSISTENCE_CALL]) == (2, 2)
    finally:
        reader.close()
    # As the sidecar passes it.
    device = Snapshot.from_json(taken.to_json()).devices[0]
    assert (device.vbios_version, device.persistence_mode) == ("96.00.8D.00.03", True)


# --- the series ------------------------------------------------------------------------------


def submitted(snapshot, base_tags=("rack:a1",)):
    """(metric, value, tags) of every series submit_inventory sends, GPU i tagged gpu_index:i."""
    sent = []
    submit_inventory(lambda name, value, tags: sent.append((name, value, tags)), snapshot, list(base_tags),
                     {device.index: [*base_tags, f"gpu_index:{device.index}"] for device in snapshot.devices})
    return sent


def test_node_info_and_persistence_mode_of_a_node_of_two_models():
    sim = SimulatedNvml(load_scenario("legacy-driver"), SimClock(speed=0))
    reader = reader_of(sim)
    try:
        snapshot = reader.read()
    finally:
        reader.close()
    assert submitted(snapshot) == [
        ("node.info", 1, ["rack:a1", "gpu_driver_version:470.256.02", "cuda_driver_version:11.4",
                          "nvml_version:11.470.256.02", "gpu_device:quadro_p4000",
                          "gpu_device:tesla_v100-sxm2-32gb"]),
        # Lower case, as Datadog stores tags.
        ("device.persistence_mode", 1, ["rack:a1", "gpu_index:0", "vbios_version:88.00.4f.00.09"]),
        ("device.persistence_mode", 1, ["rack:a1", "gpu_index:1", "vbios_version:86.04.26.00.36"]),
    ]


def test_what_is_unknown_is_left_out():
    snapshot = Snapshot(timestamp=0.0, node=Node(driver_version="550.90.07"), devices=[
        Device(index=0, uuid="GPU-0", name="NVIDIA H100 PCIe", persistence_mode=False),
        Device(index=1, uuid="GPU-1", name="NVIDIA H100 PCIe", vbios_version="96.00.74.00.11"),
        Device(index=2, uuid=None, lost=True),
    ])
    assert submitted(snapshot, base_tags=()) == [
        # One tag per model; no CUDA or NVML version where NVML gave none.
        ("node.info", 1, ["gpu_driver_version:550.90.07", "gpu_device:nvidia_h100_pcie"]),
        # No VBIOS tag where the VBIOS is unknown; no series where persistence mode is.
        ("device.persistence_mode", 0, ["gpu_index:0"]),
    ]
