"""The node's verdict: GPUs that do not reach NVML, layer by layer; ports down, slow, flapping or too
few; and the ports' series. Snapshots are built as the node reader fills them from sysfs."""

import logging

import pytest

from gpu_monitoring.health.node_health import NodeJudge, expectation
from gpu_monitoring.snapshot import Device, NetworkPort, Node, PciFunction, Snapshot
from gpu_monitoring.status import Status

H100 = "NVIDIA H100 80GB HBM3"
ADDRESSES = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"]


def nvml_id(address):
    return "0000" + address.upper()


def gpu_function(address, driver="nvidia"):
    return PciFunction(address=address, class_code=0x030200, kind="gpu", device_id=0x2330, driver=driver)


def port(device, number=1, state="ACTIVE", phys_state="LinkUp", rate=400.0, layer="InfiniBand", **counters):
    return NetworkPort(device=device, port=number, state=state, phys_state=phys_state, rate_gbps=rate,
                       link_layer=layer, netdev=f"ib{device[-1]}", counters=counters)


def snapshot(functions=None, in_nvml=ADDRESSES, in_driver=ADDRESSES, ports=None, timestamp=1000.0, name=H100):
    devices = [Device(index=i, uuid=f"GPU-{i}", name=name, pci_bus_id=nvml_id(a)) for i, a in enumerate(in_nvml)]
    node = Node(pci_functions=[gpu_function(a) for a in ADDRESSES] if functions is None else functions,
                driver_gpus=None if in_driver is None else [nvml_id(a) for a in in_driver], network_ports=ports)
    return Snapshot(timestamp=timestamp, node=node, devices=devices)


def judge(**options):
    settings = dict(sysfs_root="/host/sys", expected_gpus=None, expected_ports="auto", expected_rate="auto",
                    exclude=[])
    return NodeJudge(**{**settings, **options})


def test_every_gpu_reaching_nvml_is_ok():
    verdict = judge().judge(snapshot())
    assert verdict.health.status is Status.OK and verdict.health.reasons == []
    assert verdict.gpus_on_bus == 4


def test_a_gpu_on_the_bus_with_no_driver_is_named_by_bus_id():
    functions = [gpu_function(a) for a in ADDRESSES[:3]] + [gpu_function(ADDRESSES[3], driver=None)]
    verdict = judge().judge(snapshot(functions, in_nvml=ADDRESSES[:3], in_driver=ADDRESSES[:3]))
    assert verdict.health.status is Status.CRITICAL
    assert verdict.health.reasons == ["0000:5d:00.0 is on the PCI bus but no driver is bound to it",
                                      "NVML lists 3 GPUs, 4 are on the PCI bus"]


@pytest.mark.parametrize("in_driver, reason", [
    (ADDRESSES[:3], "0000:5d:00.0 is bound to nvidia but the driver did not set it up (not in its GPU record)"),
    (ADDRESSES, "0000:5d:00.0 is in the driver's record but NVML does not list it"),
], ids=["driver did not set it up", "NVML does not list it"])
def test_each_layer_that_loses_a_gpu_is_said(in_driver, reason):
    verdict = judge().judge(snapshot(in_nvml=ADDRESSES[:3], in_driver=in_driver))
    assert verdict.health.reasons == [reason, "NVML lists 3 GPUs, 4 are on the PCI bus"]


def test_a_gpu_bound_to_another_driver_is_named():
    functions = [gpu_function(a) for a in ADDRESSES[:3]] + [gpu_function(ADDRESSES[3], driver="nouveau")]
    verdict = judge().judge(snapshot(functions, in_nvml=ADDRESSES[:3], in_driver=ADDRESSES[:3]))
    assert "0000:5d:00.0 is bound to nouveau, not nvidia" in verdict.health.reasons


def test_a_gpu_passed_to_a_virtual_machine_is_not_missing():
    functions = [gpu_function(a) for a in ADDRESSES[:3]] + [gpu_function(ADDRESSES[3], driver="vfio-pci")]
    verdict = judge().judge(snapshot(functions, in_nvml=ADDRESSES[:3], in_driver=ADDRESSES[:3]))
    assert verdict.health.status is Status.OK
    # No fault: said in the log, not in the OK service check's message (the Agent drops it; its stub refuses it).
    assert verdict.health.message == "" and verdict.health.reasons == []
    assert verdict.health.notes == ["0000:5d:00.0 is bound to vfio-pci: passed to a virtual machine, not missing"]
    assert verdict.gpus_on_bus == 3


def test_a_note_is_logged_once_and_joins_a_faults_message(caplog):
    functions = [gpu_function(a) for a in ADDRESSES[:3]] + [gpu_function(ADDRESSES[3], driver="vfio-pci")]
    judged = judge()
    caplog.set_level(logging.INFO, logger="gpu_monitoring.health.node_health")
    for _ in range(3):
        judged.judge(snapshot(functions, in_nvml=ADDRESSES[:3], in_driver=ADDRESSES[:3]))
    assert len([r for r in caplog.records if "passed to a virtual machine" in r.getMessage()]) == 1
    # With a fault beside it, the note is part of the message that says what is and is not wrong.
    missing = judged.judge(snapshot(functions, in_nvml=ADDRESSES[:2], in_driver=ADDRESSES[:3]))
    assert missing.health.status is Status.CRITICAL
    assert missing.health.message.endswith("passed to a virtual machine, not missing")


def test_nvswitches_and_audio_functions_are_not_gpus():
    others = [PciFunction("0000:05:00.0", 0x068000, "nvswitch", 0x22a3, "nvidia"),
              PciFunction("0000:18:00.1", 0x040300, "audio", 0x22ba, None)]
    verdict = judge().judge(snapshot([gpu_function(a) for a in ADDRESSES] + others))
    assert verdict.health.status is Status.OK and verdict.gpus_on_bus == 4


def test_fewer_gpus_than_expected_is_critical():
    verdict = judge(expected_gpus=8).judge(snapshot())
    assert verdict.health.status is Status.CRITICAL
    assert verdict.health.reasons == ["8 GPUs expected, 4 found"]


def test_a_sysfs_without_nvidia_functions_is_the_wrong_view_not_missing_gpus():
    verdict = judge().judge(snapshot(functions=[]))
    assert verdict.health.status is Status.WARNING
    assert verdict.health.reasons == [
        "sysfs_root /host/sys shows no NVIDIA GPU on the PCI bus while NVML lists 4: it is not the host's sysfs "
        "(mount the host's /sys read-only and point sysfs_root at it)"]


def test_an_unreadable_sysfs_is_a_warning_naming_it():
    taken = snapshot()
    taken.node.pci_functions, taken.node.sysfs_problem = None, "cannot list /host/sys/bus/pci/devices: no such file"
    verdict = judge().judge(taken)
    assert verdict.health.status is Status.WARNING and verdict.gpus_on_bus is None
    assert "sysfs_root /host/sys cannot be read" in verdict.health.message


def test_without_the_driver_record_the_other_layers_still_judge():
    verdict = judge().judge(snapshot(in_nvml=ADDRESSES[:3], in_driver=None))
    assert verdict.health.reasons[0] == "0000:5d:00.0 is in the driver's record but NVML does not list it"


@pytest.mark.parametrize("models, ports, rate", [
    ([H100] * 8, 8, 400.0), (["NVIDIA B200"] * 8, 8, 400.0), (["NVIDIA GB200"] * 4, 4, 400.0),
    ([H100] * 4, None, None), (["NVIDIA H100 PCIe"] * 8, None, None), ([H100] * 7 + ["NVIDIA B200"], None, None),
])
def test_auto_expects_one_400g_port_per_gpu_on_reference_systems_only(models, ports, rate):
    assert expectation("auto", "auto", models) == (ports, rate, False)


def test_configured_expectations_win():
    assert expectation(4, 200, [H100] * 8) == (4, 200.0, True)


def test_on_a_reference_system_ports_beside_the_compute_ones_are_judged_by_their_peers():
    all_gpus = [f"0000:{0x18 + i:02x}:00.0" for i in range(8)]
    storage = [port("mlx5_8", rate=100.0, layer="Ethernet"), port("mlx5_9", rate=100.0, layer="Ethernet")]
    verdict = judge().judge(snapshot([gpu_function(a) for a in all_gpus], all_gpus, all_gpus, ib_ports() + storage))
    assert verdict.health.status is Status.OK


def test_an_expected_rate_set_applies_to_every_port():
    ports = [port("mlx5_0"), port("eth0", rate=100.0, layer="Ethernet")]
    verdict = judge(expected_rate=400).judge(snapshot(ports=ports))
    assert verdict.health.reasons == ["port eth0/1 (ib0) runs at 100 Gb/s, below 400 Gb/s"]


def ib_ports(**changes):
    ports = {f"mlx5_{i}": port(f"mlx5_{i}", link_downed=0, port_rcv_data=0, port_xmit_data=0) for i in range(8)}
    ports.update(changes)
    return list(ports.values())


def test_a_full_node_of_ports_is_ok_and_sends_each_ports_series():
    all_gpus = [f"0000:{0x18 + i:02x}:00.0" for i in range(8)]
    functions = [gpu_function(a) for a in all_gpus]
    nodejudge = judge()
    nodejudge.judge(snapshot(functions, all_gpus, all_gpus, ib_ports()))
    moved = ib_ports(mlx5_0=port("mlx5_0", link_downed=0, port_rcv_data=3750, port_xmit_data=7500))
    verdict = nodejudge.judge(snapshot(functions, all_gpus, all_gpus, moved, timestamp=1015.0))
    assert verdict.health.status is Status.OK
    tags, values = verdict.ports[0]
    assert tags == ["ib_device:mlx5_0", "ib_port:1", "link_layer:infiniband", "netdev:ib0"]
    assert values == {"network.port.up": 1, "network.port.rate": 400.0, "network.port.expected_rate": 400.0,
                      "network.port.errors.link_downed": 0, "network.port.throughput.rx": 1000.0,
                      "network.port.throughput.tx": 2000.0}


def test_too_few_ports_up_at_the_expected_rate_is_critical_naming_them():
    all_gpus = [f"0000:{0x18 + i:02x}:00.0" for i in range(8)]
    functions = [gpu_function(a) for a in all_gpus]
    ports = ib_ports(mlx5_2=port("mlx5_2", state="DOWN", phys_state="Polling"), mlx5_5=port("mlx5_5", rate=200.0))
    verdict = judge().judge(snapshot(functions, all_gpus, all_gpus, ports))
    assert verdict.health.status is Status.CRITICAL
    assert verdict.health.reasons == [
        "port mlx5_2/1 (ib2) is down (state DOWN, physical state Polling)",
        "port mlx5_5/1 (ib5) runs at 200 Gb/s, below 400 Gb/s",
        "6 of 8 expected InfiniBand/RoCE ports are up at 400 Gb/s (mlx5_2/1 down, mlx5_5/1 at 200 Gb/s)",
    ]


def test_without_an_expected_rate_a_port_slower_than_its_peers_is_a_warning():
    ports = [port("mlx5_0"), port("mlx5_1"), port("mlx5_2", rate=200.0), port("eth0", rate=100.0, layer="Ethernet")]
    verdict = judge().judge(snapshot(ports=ports))
    assert verdict.health.status is Status.WARNING
    assert verdict.health.reasons == ["port mlx5_2/1 (ib2) runs at 200 Gb/s, below 400 Gb/s"]


def test_a_flap_between_two_runs_is_seen_from_link_downed():
    nodejudge = judge()
    nodejudge.judge(snapshot(ports=[port("mlx5_1", link_downed=3)]))
    verdict = nodejudge.judge(snapshot(ports=[port("mlx5_1", link_downed=4)], timestamp=1015.0))
    assert verdict.health.status is Status.WARNING
    assert verdict.health.reasons == ["port mlx5_1/1 (ib1) flapped: its link went down 1 time since the last run"]
    assert "flap:mlx5_1/1" in verdict.health.holdable


def test_excluded_ports_send_nothing_and_count_for_nothing():
    ports = [port("mlx5_0"), port("mlx5_4", state="DOWN", phys_state="Disabled")]
    verdict = judge(exclude=["mlx5_4"], expected_ports=1).judge(snapshot(ports=ports))
    assert verdict.health.status is Status.OK
    assert [tags[0] for tags, _ in verdict.ports] == ["ib_device:mlx5_0"]


@pytest.mark.parametrize("pattern", ["mlx5_4", "mlx5_4/1", "ib4", "mlx5_*"])
def test_a_port_is_excluded_by_device_port_or_netdev(pattern):
    verdict = judge(exclude=[pattern]).judge(snapshot(ports=[port("mlx5_4", state="DOWN", phys_state="Polling")]))
    assert verdict.ports == [] and verdict.health.status is Status.OK


def test_a_node_without_infiniband_has_no_network_series_nor_reasons():
    verdict = judge(expected_ports=8).judge(snapshot(ports=None))
    assert verdict.ports == [] and verdict.health.status is Status.OK


def test_without_nvml_the_bus_is_judged_against_the_driver_record_alone():
    taken = snapshot(in_nvml=[], in_driver=ADDRESSES[:3])
    verdict = judge(expected_gpus=4).judge(taken, nvml_read=False)
    assert verdict.health.reasons == [
        "0000:5d:00.0 is bound to nvidia but the driver did not set it up (not in its GPU record)"]


def test_a_wrong_sysfs_root_is_logged_once(caplog):
    nodejudge = judge()
    for _ in range(3):
        nodejudge.judge(snapshot(functions=[]))
    told = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(told) == 1 and told[0].startswith("sysfs_root /host/sys shows no NVIDIA GPU")
