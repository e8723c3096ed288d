"""The InfiniBand and RoCE ports, read from sysfs trees recorded from real command output."""

import pytest

from gpu_monitoring.node.infiniband import PortReader
from gpu_monitoring.snapshot import NetworkPort

from .sysfs_support import materialize

QUIET = {"link_downed": 0, "symbol_error": 0, "link_error_recovery": 0, "port_rcv_errors": 0, "port_xmit_discards": 0}


def ports_of(recording, tmp_path):
    ports = PortReader(str(materialize(recording, tmp_path))).read()
    return {port.device: port for port in ports}


def test_an_hgx_node_lists_every_port_by_device_and_port(tmp_path):
    ports = PortReader(str(materialize("hgx-h100-infiniband.txt", tmp_path))).read()

    assert [(p.device, p.port) for p in ports] == [(f"mlx5_{n}", 1) for n in range(9)]


def test_an_active_infiniband_port_gives_its_states_rate_interface_and_counters(tmp_path):
    port = ports_of("hgx-h100-infiniband.txt", tmp_path)["mlx5_0"]

    assert port == NetworkPort(
        device="mlx5_0", port=1, state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0, link_layer="InfiniBand",
        netdev="ibp24s0", counters={**QUIET, "port_rcv_data": 93457203938114, "port_xmit_data": 93457199384720},
        # Its NIC function, through `device`, and the port above it: PCIe AER errors on that link are its own.
        pci_address="0000:18:00.0", parent="0000:17:01.0",
    )


def test_a_port_without_link_is_down_and_polling(tmp_path):
    port = ports_of("hgx-h100-infiniband.txt", tmp_path)["mlx5_3"]

    assert (port.state, port.phys_state, port.rate_gbps) == ("DOWN", "Polling", 10.0)
    assert port.counters["link_downed"] == 3


def test_a_counter_file_that_is_missing_is_left_out(tmp_path):
    counters = ports_of("hgx-h100-infiniband.txt", tmp_path)["mlx5_5"].counters

    assert "port_xmit_discards" not in counters
    assert counters["port_rcv_data"] == 89584729301834


def test_a_roce_port_finds_its_interface_by_dev_port_and_leaves_out_the_counter_its_driver_refuses(tmp_path):
    port = ports_of("hgx-h100-infiniband.txt", tmp_path)["mlx5_8"]

    assert (port.link_layer, port.netdev, port.rate_gbps) == ("Ethernet", "enp170s0f0np0", 200.0)
    assert "symbol_error" not in port.counters
    assert port.counters["link_downed"] == 0


def test_a_device_without_interfaces_has_no_netdev(tmp_path):
    port = ports_of("hgx-h100-infiniband.txt", tmp_path)["mlx5_7"]

    assert port.netdev is None
    assert port.state == "ACTIVE"


def test_two_ports_of_one_function_are_told_apart_by_dev_port(tmp_path):
    ports = PortReader(str(materialize("connectx3-dual-port-infiniband.txt", tmp_path))).read()

    assert [(p.port, p.link_layer, p.netdev, p.rate_gbps) for p in ports] == [
        (1, "InfiniBand", "ib0", 56.0),
        (2, "Ethernet", "enp4s0d1", 40.0),
    ]


def test_without_dev_port_only_a_single_port_device_takes_its_only_interface(tmp_path):
    # Kernels before 3.15 have no dev_port.
    hgx = materialize("hgx-h100-infiniband.txt", tmp_path / "hgx")
    (hgx / "class/infiniband/mlx5_0/device/net/ibp24s0/dev_port").unlink()
    dual = materialize("connectx3-dual-port-infiniband.txt", tmp_path / "dual")
    for netdev in ("ib0", "enp4s0d1"):
        (dual / "class/infiniband/mlx4_0/device/net" / netdev / "dev_port").unlink()

    assert {p.device: p.netdev for p in PortReader(str(hgx)).read()}["mlx5_0"] == "ibp24s0"
    assert [p.netdev for p in PortReader(str(dual)).read()] == [None, None]


@pytest.mark.parametrize("text, gbps", [
    ("400 Gb/sec (4X NDR)", 400.0),
    ("100 Gb/sec (4X EDR)", 100.0),
    ("25 Gb/sec (1X EDR)", 25.0),
    ("10 Gb/sec (4X)", 10.0),
    ("2.5 Gb/sec (1X SDR)", 2.5),
    ("fast", None),
])
def test_rates_as_the_kernel_writes_them(tmp_path, text, gbps):
    root = materialize("connectx3-dual-port-infiniband.txt", tmp_path)
    (root / "class/infiniband/mlx4_0/ports/1/rate").write_text(text + "\n")

    assert PortReader(str(root)).read()[0].rate_gbps == gbps


def test_texts_that_are_not_what_the_kernel_writes_read_as_unknown(tmp_path):
    root = materialize("connectx3-dual-port-infiniband.txt", tmp_path)
    port = root / "class/infiniband/mlx4_0/ports/1"
    (port / "state").write_text("ACTIVE\n")
    (port / "phys_state").write_text("5: <unknown>\n")
    # What older kernels wrote where the port's agent did not answer, before they failed the read instead.
    (port / "counters/symbol_error").write_text("N/A (no PMA)\n")

    read = PortReader(str(root)).read()[0]

    assert (read.state, read.phys_state) == (None, None)
    assert "symbol_error" not in read.counters


def test_a_node_without_rdma_devices_has_no_ports_to_read(tmp_path):
    assert PortReader(str(tmp_path)).read() is None


def test_an_rdma_class_without_devices_has_an_empty_list_of_ports(tmp_path):
    (tmp_path / "class/infiniband").mkdir(parents=True)

    assert PortReader(str(tmp_path)).read() == []


def test_interfaces_are_resolved_once_and_again_when_a_port_appears(tmp_path):
    root = materialize("hgx-h100-infiniband.txt", tmp_path)
    reader = PortReader(str(root))
    assert {p.device: p.netdev for p in reader.read()}["mlx5_7"] is None

    # mlx5_7's interface comes up: the same ports are listed, so the read does not look again.
    net = root / "class/infiniband/mlx5_7/device/net/ibp220s0"
    net.mkdir(parents=True)
    (net / "dev_port").write_text("0\n")
    assert {p.device: p.netdev for p in reader.read()}["mlx5_7"] is None

    # A port appears: every port's interface is resolved again.
    materialize("hgx-h100-infiniband-added.txt", root)
    netdevs = {p.device: p.netdev for p in reader.read()}
    assert (netdevs["mlx5_7"], netdevs["mlx5_9"]) == ("ibp220s0", "enp170s0f1np1")


def test_states_and_counters_are_read_every_time(tmp_path):
    root = materialize("hgx-h100-infiniband.txt", tmp_path)
    reader = PortReader(str(root))
    reader.read()
    port = root / "class/infiniband/mlx5_3/ports/1"
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "counters/link_downed").write_text("4\n")

    read = {p.device: p for p in reader.read()}["mlx5_3"]

    assert (read.state, read.phys_state, read.rate_gbps, read.counters["link_downed"]) == ("ACTIVE", "LinkUp", 400.0, 4)


def test_a_device_that_goes_is_no_longer_listed(tmp_path):
    root = materialize("hgx-h100-infiniband.txt", tmp_path)
    reader = PortReader(str(root))
    reader.read()
    (root / "class/infiniband/mlx5_8").unlink()  # its driver unbound: the class link goes

    assert [p.device for p in reader.read()] == [f"mlx5_{n}" for n in range(8)]

