"""The node around the GPUs end to end, through the check on simulated nodes: a GPU missing from the bus,
InfiniBand ports that flap or train slow, verdicts held until the fix (in local and sidecar mode,
across an Agent restart), an XID storm, and a node whose NVML cannot be read."""

import time

from datadog_checks.base import AgentCheck

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.cli.main import CRITICAL_FOUND, main

from .conftest import tag_dict
from .sidecar_support import SidecarProcess, wait_until
from .sysfs_support import materialize

NODE_HEALTH = "gpu_monitoring.node.health"


def node_health(aggregator):
    (stub,) = aggregator.service_checks(NODE_HEALTH)
    return stub


def test_a_gpu_on_the_bus_that_never_came_up_fails_the_check_naming_it(capsys):
    assert main(["check", "--simulate", "gpu-missing"]) == CRITICAL_FOUND
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("node.health")]
    assert "CRITICAL" in line
    # The driver's own words from the kernel's log say why it never came up.
    assert "0000:c1:00.0 is on the PCI bus; the driver failed to initialise it (RmInitAdapter failed! " \
           "0x26:0x56:1474)" in line
    assert "NVML lists 3 GPUs, 4 are on the PCI bus" in line and "4 GPUs expected, 3 found" in line


def test_gpu_missing_sends_what_the_bus_and_the_operator_say(node, aggregator):
    missing = node("gpu-missing").run()
    assert missing.series("node.gpus.pci")[0].value == 4
    assert missing.series("node.gpus.expected")[0].value == 4
    assert missing.series("devices.count")[0].value == 3
    assert node_health(aggregator).status == AgentCheck.CRITICAL


def test_a_dgx_h100_is_healthy_with_its_ten_ports(node, aggregator):
    dgx = node("dgx-h100").run(2)
    assert node_health(aggregator).status == AgentCheck.OK
    assert dgx.series("node.gpus.pci")[0].value == 8
    ports = {(t["ib_device"], t["link_layer"]): stub.value
             for stub in dgx.series("network.port.rate") for t in [tag_dict(stub.tags)]}
    assert len(ports) == 10
    assert [rate for (_, layer), rate in ports.items() if layer == "infiniband"] == [400.0] * 8
    received = dgx.series("network.port.throughput.rx")
    assert len(received) == 10 and all(stub.value > 0 for stub in received)


def test_the_faults_timeline(node, aggregator):
    """GPU 3's double-bit error holds its health CRITICAL on every run until the driver reload at t=110;
    the flap at t=35 is seen at t=45 though both runs see the port up; the port that retrains at 200 Gb/s
    at t=65 is a WARNING from t=75; the storm of 5,000 XID 13 at t=95 is one event and an exact count."""
    faults = node("faults")
    seen = {}
    while faults.now < 135:
        faults.run()
        seen[round(faults.now)] = (faults.health()[3], node_health(aggregator), list(aggregator.events),
                                   xid_totals(aggregator))
    for t in range(30, 110, 15):
        gpu3 = seen[t][0]
        assert gpu3.status == AgentCheck.CRITICAL, t
        assert "double-bit ECC error event" in gpu3.message
        assert (t == 30) != ("(held since " in gpu3.message), t
    assert seen[120][0].status == AgentCheck.OK
    assert seen[30][1].status == AgentCheck.OK
    assert "port mlx5_1/1" in seen[45][1].message and "flapped" in seen[45][1].message
    assert seen[45][1].status == AgentCheck.WARNING
    assert "port mlx5_3/1" in seen[75][1].message and "runs at 200 Gb/s, below 400 Gb/s" in seen[75][1].message
    (storm,) = [event for event in seen[105][2] if "× 5,000" in event["msg_title"]]
    assert storm["msg_title"].startswith("XID 13 × 5,000 on GPU 4")
    assert seen[105][3][("4", "13")] == 5000
    # The ring kept the storm's last lines only: those name the process they hit, the rest NVML alone told.
    named = [(tags, value) for tags, value in xid_series(seen, 105) if "process_name:python3" in tags]
    assert named and sum(value for _, value in named) < 5000


def xid_totals(aggregator):
    """XIDs counted by GPU and code, whoever's process they hit (each owner's is a series of its own)."""
    totals = {}
    for stub in aggregator.metrics("gpu_monitoring.xid_errors"):
        tags = tag_dict(stub.tags)
        totals[(tags["gpu_index"], tags["xid"])] = totals.get((tags["gpu_index"], tags["xid"]), 0) + stub.value
    totals["series"] = [(",".join(stub.tags), stub.value) for stub in aggregator.metrics("gpu_monitoring.xid_errors")]
    return totals


def xid_series(seen, at):
    return seen[at][3]["series"]


def test_a_held_verdict_survives_an_agent_restart_in_sidecar_mode(tmp_path, aggregator):
    """The sidecar runs the faults node 5 times faster than real time: a check reads GPU 3's double-bit
    error event (t=20, 4 s in: time for the sidecar to register for events first, even on a busy
    machine), another check (the Agent restarted) still holds it, and the driver reload at t=110 (22 s
    in) clears it."""
    started = time.monotonic()
    sidecar = SidecarProcess(tmp_path, "faults", "--speed", "5").start()
    instance = {"source": "sidecar", "sidecar_socket": sidecar.socket, "kubernetes": False}
    try:
        first = GpuMonitoringCheck("gpu_monitoring", {}, [instance])
        # Its event read (the journal's cursor moved past it), whether or not a run before it saw the count.
        wait_until(lambda: "double-bit ECC error event" in _gpu3(first, aggregator)[1], 30,
                   "GPU 3's double-bit ECC error event was never read")
        # The node is judged in sidecar mode too, from the sysfs the sidecar read.
        assert node_health(aggregator).status in (AgentCheck.OK, AgentCheck.WARNING)
        assert len(aggregator.metrics("gpu_monitoring.network.port.up")) == 4
        first.cancel()
        restarted = GpuMonitoringCheck("gpu_monitoring", {}, [instance])
        status, message = _gpu3(restarted, aggregator)
        if time.monotonic() - started < 18:  # scenario time 90: before the driver reload
            assert status == AgentCheck.CRITICAL and "(held since " in message, message
        wait_until(lambda: _gpu3(restarted, aggregator)[0] == AgentCheck.OK, 60, "the driver reload never cleared it")
    finally:
        sidecar.stop()


def _gpu3(check, aggregator):
    """GPU 3's health status and message in a run of the check."""
    aggregator.reset()
    assert check.run() == ""
    for stub in aggregator.service_checks("gpu_monitoring.device.health"):
        if tag_dict(stub.tags)["gpu_index"] == "3":
            return stub.status, stub.message or ""
    return None, ""


def test_without_nvml_the_node_is_still_judged_from_sysfs(tmp_path, aggregator):
    """A driver that brought up none of the GPUs: NVML cannot be read, and node.health says what the bus holds."""
    sysfs = materialize("hgx-h100-pci.txt", tmp_path / "sys")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "stat").write_text(f"btime {int(time.time()) - 3600}\n")
    # The kernel's log says why one GPU never came up (as /dev/kmsg gives it; the driver prints at warning).
    kernel_log = tmp_path / "kmsg"
    kernel_log.write_text("4,0,5000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07  Thu Jun  6 "
                          "2024\n4,1,9000000,-;NVRM: GPU 0000:1b:00.0: RmInitAdapter failed! (0x25:0x65:1203)\n")
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{
        "nvml_library_path": str(tmp_path / "libnvidia-ml.so.1"), "sysfs_root": str(sysfs),
        "proc_root": str(tmp_path / "proc"), "expected_gpus": 9, "kubernetes": False, "kernel_log": str(kernel_log),
    }])
    assert check.run() == ""
    (nvml,) = aggregator.service_checks("gpu_monitoring.nvml.can_connect")
    assert nvml.status == AgentCheck.CRITICAL
    health = node_health(aggregator)
    assert health.status == AgentCheck.CRITICAL and health.message == (
        "0000:1b:00.0 is on the PCI bus; the driver failed to initialise it (RmInitAdapter failed! "
        "0x25:0x65:1203); 9 GPUs expected, 8 found")
    assert aggregator.metrics("gpu_monitoring.node.gpus.pci")[0].value == 8
    assert aggregator.service_checks("gpu_monitoring.device.health") == []
