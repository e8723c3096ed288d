"""The simulated node's sysfs and boot ID, and what a driver reload restarts.

The sysfs is read here as files, the way the kernel shows them (kernel Documentation/ABI/stable/
sysfs-class-infiniband, drivers/pci/pci-sysfs.c); NVML through the real pynvml bindings over the
simulated library. Scenario time stands still unless a test moves it.
"""

import os
import re
from pathlib import Path

import pynvml
import pytest
import yaml

from gpu_monitoring.nvml import library
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.node import simulated_node
from gpu_monitoring.simulator.scenario import ScenarioError, resolve
from gpu_monitoring.simulator.scenario import load as load_scenario

UUID_LINE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\n")
# 400 Gb/s of which a quarter is carried out of the port, in the 4-octet words the counters count.
WORDS_PER_SECOND = 400e9 * 0.25 / 8 / 4


@pytest.fixture
def started():
    """started(scenario) -> (node, sysfs root, proc root) at t=0 on a clock that moves only when told."""
    nodes = []

    def start(scenario):
        nodes.append(simulated_node(scenario, SimClock(speed=0)))
        options = nodes[-1].start(serve_kubernetes=False)
        return nodes[-1], Path(options["sysfs_root"]), Path(options["proc_root"])

    yield start
    for node in nodes:
        node.stop()


@pytest.fixture
def nvml():
    """nvml(node): pynvml initialised over the node's simulated library; shut down afterwards."""
    def init(node):
        library.load(node.nvml.library)
        pynvml.nvmlInit()
        return node.nvml

    yield init
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass


def read(path):
    return Path(path).read_text()


def functions(sysfs):
    """{address: (vendor, device, class, driver or None)} of every PCI function."""
    found = {}
    for entry in (sysfs / "bus" / "pci" / "devices").iterdir():
        driver = entry / "driver"
        found[entry.name] = (read(entry / "vendor"), read(entry / "device"), read(entry / "class"),
                             os.path.basename(os.readlink(driver)) if driver.is_symlink() else None)
    return found


def port(sysfs, name):
    """{file: text} of port `mlx5_N/P`: its state, rate and link layer, and counters/<name>."""
    device, number = name.split("/")
    directory = sysfs / "class" / "infiniband" / device / "ports" / number
    files = {name: read(directory / name) for name in ("state", "phys_state", "rate", "link_layer")}
    files.update({f"counters/{c.name}": read(c) for c in (directory / "counters").iterdir()})
    return files


def counter(sysfs, name, which):
    return int(port(sysfs, name)[f"counters/{which}"])


# --- the tree's format -------------------------------------------------------------------


def test_a_gpu_an_nvswitch_and_a_nic_as_the_kernel_shows_them(started):
    _, sysfs, _ = started("dgx-h100")
    found = functions(sysfs)
    assert found["0000:18:00.0"] == ("0x10de\n", "0x2330\n", "0x030200\n", "nvidia")
    assert found["0000:05:00.0"] == ("0x10de\n", "0x22a3\n", "0x068000\n", "nvidia")
    assert found["0000:15:00.0"] == ("0x15b3\n", "0x1021\n", "0x020700\n", "mlx5_core")
    assert found["0000:29:00.1"] == ("0x15b3\n", "0x1021\n", "0x020000\n", "mlx5_core")
    # As on a real node: the bus lists links into devices/, where the GPU sits behind its root port, and
    # `driver` is a link to the driver's directory.
    listed = sysfs / "bus" / "pci" / "devices" / "0000:18:00.0"
    assert listed.is_symlink()
    assert listed.resolve() == sysfs / "devices" / "pci0000:00" / "0000:00:01.1" / "0000:18:00.0"
    assert os.readlink(listed / "driver") == "../../../../bus/pci/drivers/nvidia"
    assert (listed / "driver").resolve() == sysfs / "bus" / "pci" / "drivers" / "nvidia"


def test_a_port_as_the_kernel_shows_it(started):
    _, sysfs, _ = started("dgx-h100")
    assert port(sysfs, "mlx5_0/1") == {
        "state": "4: ACTIVE\n",
        "phys_state": "5: LinkUp\n",
        "rate": "400 Gb/sec (4X NDR)\n",
        "link_layer": "InfiniBand\n",
        **{f"counters/{name}": "0\n" for name in (
            "link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors", "port_xmit_discards",
            "port_rcv_data", "port_xmit_data")},
    }
    storage = port(sysfs, "mlx5_8/1")
    assert (storage["link_layer"], storage["rate"]) == ("Ethernet\n", "100 Gb/sec (4X EDR)\n")
    # The RDMA device's `device` is its PCI function, whose network interface has dev_port = port - 1.
    device = sysfs / "class" / "infiniband" / "mlx5_0" / "device"
    assert device.is_symlink() and device.resolve() == (sysfs / "bus" / "pci" / "devices" / "0000:15:00.0").resolve()
    assert [(i.name, read(i / "dev_port")) for i in (device / "net").iterdir()] == [("ibp21s0", "0\n")]
    assert read(sysfs / "class" / "infiniband" / "mlx5_8" / "device" / "net" / "enp41s0f1np1" / "dev_port") == "0\n"


def test_a_dual_port_nic_names_its_interfaces_by_function(started):
    _, sysfs, _ = started("gpu-missing")
    names = {d: os.listdir(sysfs / "class" / "infiniband" / d / "device" / "net") for d in ("mlx5_0", "mlx5_1")}
    assert names == {"mlx5_0": ["enp33s0f0np0"], "mlx5_1": ["enp33s0f1np1"]}
    assert port(sysfs, "mlx5_1/1")["rate"] == "200 Gb/sec (4X HDR)\n"


def test_dgx_h100_has_its_nvswitches_and_ten_ports(started):
    node, sysfs, _ = started("dgx-h100")
    nvidia = {address: f for address, f in functions(sysfs).items() if f[0] == "0x10de\n"}
    classes = sorted(f[2] for f in nvidia.values())
    assert classes == ["0x030200\n"] * 8 + ["0x068000\n"] * 4
    assert {f[3] for f in nvidia.values()} == {"nvidia"}
    assert {address for address, f in nvidia.items() if f[2] == "0x030200\n"} == {
        d.spec.pci_address for d in node.nvml.devices}
    ports = {device: port(sysfs, f"{device}/1") for device in os.listdir(sysfs / "class" / "infiniband")}
    assert len(ports) == 10
    layers = sorted((p["link_layer"], p["rate"]) for p in ports.values())
    assert layers == [("Ethernet\n", "100 Gb/sec (4X EDR)\n")] * 2 + [("InfiniBand\n", "400 Gb/sec (4X NDR)\n")] * 8


def test_gpu_missing_has_a_gpu_on_the_bus_that_the_driver_could_not_set_up(started, nvml):
    node, sysfs, proc = started("gpu-missing")
    gpus = {address: f for address, f in functions(sysfs).items() if f[2] == "0x030200\n"}
    assert {f[:2] for f in gpus.values()} == {("0x10de\n", "0x26b9\n")}
    # The fourth is bound to nvidia, whose RmInitAdapter failed on it (the kernel's log says so).
    assert {address: f[3] for address, f in gpus.items()} == dict.fromkeys(
        ["0000:01:00.0", "0000:41:00.0", "0000:81:00.0", "0000:c1:00.0"], "nvidia")
    # The driver's record and NVML both know three.
    assert sorted(os.listdir(proc / "driver" / "nvidia" / "gpus")) == ["0000:01:00.0", "0000:41:00.0", "0000:81:00.0"]
    nvml(node)
    assert pynvml.nvmlDeviceGetCount() == 3
    assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA L40S"
    assert node.nvml.scenario.faults == []


# --- the faults timeline -----------------------------------------------------------------


def test_a_flap_between_two_runs_shows_only_in_its_counters(started):
    node, sysfs, _ = started("faults")
    node.nvml.advance(30)
    before = port(sysfs, "mlx5_1/1")
    node.nvml.advance(6)  # t=36: inside the flap (t=35 to 37)
    during = port(sysfs, "mlx5_1/1")
    node.nvml.advance(9)  # t=45
    after = port(sysfs, "mlx5_1/1")
    for seen in (before, after):
        assert (seen["state"], seen["phys_state"], seen["rate"]) == ("4: ACTIVE\n", "5: LinkUp\n",
                                                                     "400 Gb/sec (4X NDR)\n")
    assert (during["state"], during["phys_state"]) == ("1: DOWN\n", "2: Polling\n")
    for name, grew in (("link_downed", 1), ("link_error_recovery", 1), ("symbol_error", 37)):
        assert int(after[f"counters/{name}"]) - int(before[f"counters/{name}"]) == grew, name
    # While down it carried nothing: 2 s of the 15 are missing from its data.
    carried = int(after["counters/port_xmit_data"]) - int(before["counters/port_xmit_data"])
    assert carried == pytest.approx(13 * WORDS_PER_SECOND, rel=1e-6)


def test_a_slow_port_retrains_without_going_down(started):
    node, sysfs, _ = started("faults")
    node.nvml.advance(60)
    assert port(sysfs, "mlx5_3/1")["rate"] == "400 Gb/sec (4X NDR)\n"
    for t in (65, 120):
        node.nvml.advance(t - node.nvml.now())
        slow = port(sysfs, "mlx5_3/1")
        assert (slow["rate"], slow["state"], slow["counters/link_downed"]) == (
            "200 Gb/sec (4X HDR)\n", "4: ACTIVE\n", "0\n")


def test_counters_grow_with_scenario_time(started):
    node, sysfs, _ = started("faults")
    node.nvml.advance(15)
    first = {c: counter(sysfs, "mlx5_0/1", c) for c in ("port_xmit_data", "port_rcv_data")}
    node.nvml.advance(15)
    assert counter(sysfs, "mlx5_0/1", "port_xmit_data") - first["port_xmit_data"] == \
        pytest.approx(15 * WORDS_PER_SECOND, rel=1e-6)
    assert counter(sysfs, "mlx5_0/1", "port_rcv_data") > first["port_rcv_data"]
    assert counter(sysfs, "mlx5_0/1", "symbol_error") == 0


def test_the_files_follow_the_clock_at_the_first_nvml_call(started, nvml):
    node, sysfs, _ = started("faults")
    sim = nvml(node)
    sim.clock.advance(36)  # the clock alone: nothing told the node yet
    assert port(sysfs, "mlx5_1/1")["state"] == "4: ACTIVE\n"
    pynvml.nvmlDeviceGetCount()
    assert port(sysfs, "mlx5_1/1")["state"] == "1: DOWN\n"


def test_the_time_is_told_once_per_instant(started, nvml):
    node, _, _ = started("faults")
    sim = nvml(node)
    told = []
    sim.on_time(told.append)
    sim.advance(15)
    for _ in range(3):
        pynvml.nvmlDeviceGetCount()
    sim.clock.advance(1)
    pynvml.nvmlDeviceGetCount()
    pynvml.nvmlDeviceGetCount()
    assert told == [15, 16]


def test_an_update_rewrites_only_what_changed(started):
    node, _, _ = started("faults")
    assert node.sysfs.update(0) == 0
    # Each port's two data counters move with time; mlx5_1's flap changes its state, rate and three counters;
    # GPU 2's fatal PCIe error at t=20 rewrites its three AER counter files and its root port's three totals.
    assert node.sysfs.update(36) == 4 * 2 + 2 + 1 + 3 + 3 + 3


# --- the driver reload -------------------------------------------------------------------


def test_a_driver_reload_restarts_the_energy_and_the_volatile_ecc_counts(started, nvml):
    node, _, _ = started("faults")
    sim = nvml(node)
    sim.advance(105)
    gpu3 = pynvml.nvmlDeviceGetHandleByIndex(3)
    before = pynvml.nvmlDeviceGetTotalEnergyConsumption(gpu3)
    assert before > 100e6 * 1000  # the scenario's 100 MJ from before t=0, in millijoules
    assert pynvml.nvmlDeviceGetTotalEccErrors(gpu3, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                              pynvml.NVML_VOLATILE_ECC) == 2
    sim.advance(15)  # t=120, 10 s after the reload at t=110
    pynvml.nvmlInit()  # the reload ended the last session
    gpu3 = pynvml.nvmlDeviceGetHandleByIndex(3)
    after = pynvml.nvmlDeviceGetTotalEnergyConsumption(gpu3)
    assert 48 * 10 * 1000 <= after <= 350 * 10 * 1000  # 10 s at between idle and the power limit
    assert pynvml.nvmlDeviceGetTotalEccErrors(gpu3, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                              pynvml.NVML_VOLATILE_ECC) == 0
    # The lifetime count, kept in the InfoROM, goes on.
    (aggregate,) = pynvml.nvmlDeviceGetFieldValues(gpu3, [pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL])
    assert aggregate.nvmlReturn == pynvml.NVML_SUCCESS and aggregate.value.ullVal == 2
    sim.advance(15)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(gpu3) > after


# --- the boot ID -------------------------------------------------------------------------


def test_the_boot_id_is_a_uuid_fixed_by_the_scenario(started):
    _, _, faults_proc = started("faults")
    _, _, again_proc = started("faults")
    _, _, dgx_proc = started("dgx-h100")
    boot_id = read(faults_proc / "sys" / "kernel" / "random" / "boot_id")
    assert UUID_LINE.fullmatch(boot_id)
    assert read(again_proc / "sys" / "kernel" / "random" / "boot_id") == boot_id
    assert read(dgx_proc / "sys" / "kernel" / "random" / "boot_id") != boot_id


# --- scenarios that cannot be -----------------------------------------------------------


@pytest.mark.parametrize("change, said", [
    (lambda raw: raw["faults"].append({"at": 5, "kind": "port_down", "port": "mlx5_9/1"}), "mlx5_9/1"),
    (lambda raw: raw["faults"].append({"at": 5, "kind": "port_slow", "port": "mlx5_0/1", "rate": 300}), "300"),
    (lambda raw: raw["node"]["network"].append({"device": "mlx5_4", "pci": "0000:18:00.0"}), "0000:18:00.0"),
    (lambda raw: raw["node"]["network"].append({"device": "mlx5_4", "pci": "0000:9c:00.0", "rate": 300}), "rate"),
    (lambda raw: raw["node"].update(pci=[{"address": "0000:05:00.0", "kind": "nvswitch"}]), "device_id"),
])
def test_a_node_that_cannot_be_is_refused(tmp_path, change, said):
    raw = yaml.safe_load(resolve("faults").read_text())
    change(raw)
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match=said):
        load_scenario(str(path))
