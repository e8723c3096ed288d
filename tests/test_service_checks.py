"""Every service check and status the check sends is declared in assets/service_checks.json."""

from datadog_checks.base import AgentCheck
from datadog_checks.dev.utils import get_service_checks

from gpu_monitoring.check import GpuMonitoringCheck

from .sidecar_support import SidecarProcess

NAMES = {
    "gpu_monitoring.nvml.can_connect",
    "gpu_monitoring.device.health",
    "gpu_monitoring.kubelet.can_connect",
    "gpu_monitoring.sidecar.can_connect",
    "gpu_monitoring.dcgm.can_connect",
    "gpu_monitoring.node.health",
}


def statuses(aggregator):
    return {(name, sc.status) for name in aggregator._service_checks for sc in aggregator.service_checks(name)}


def test_the_service_checks_are_declared():
    assert {sc["check"] for sc in get_service_checks()} == NAMES


def test_every_status_sent_is_declared(node, aggregator, tmp_path):
    seen = set()
    node("faults").run_until(45)  # GPU health OK, WARNING and CRITICAL; a port flapped: the node WARNING
    seen |= statuses(aggregator)
    aggregator.assert_service_checks(get_service_checks())
    aggregator.reset()
    node("gpu-missing").run()  # a GPU on the bus that NVML lacks: the node CRITICAL
    seen |= statuses(aggregator)
    aggregator.assert_service_checks(get_service_checks())
    for how in ("unauthorized", "error"):  # kubelet CRITICAL, then WARNING
        aggregator.reset()
        dgx = node("dgx-h100")
        dgx.check.simulated_node.kubelet.behaviour = how
        dgx.run()
        seen |= statuses(aggregator)
        aggregator.assert_service_checks(get_service_checks())
    aggregator.reset()
    node("dgx-h100").run()  # kubelet OK
    seen |= statuses(aggregator)
    aggregator.reset()
    missing = GpuMonitoringCheck("gpu_monitoring", {}, [{"nvml_library_path": str(tmp_path / "libnvidia-ml.so.1")}])
    assert missing.run() == ""
    seen |= statuses(aggregator)
    sidecar = SidecarProcess(tmp_path, "legacy-driver").start()
    try:
        for socket_path in (sidecar.socket, str(tmp_path / "none.sock")):  # sidecar OK, then CRITICAL
            aggregator.reset()
            check = GpuMonitoringCheck("gpu_monitoring", {}, [{"source": "sidecar", "sidecar_socket": socket_path,
                                                               "kubernetes": False}])
            assert check.run() == ""
            seen |= statuses(aggregator)
            aggregator.assert_service_checks(get_service_checks())
    finally:
        sidecar.stop()
    expected = {
        ("gpu_monitoring.device.health", AgentCheck.OK),
        ("gpu_monitoring.device.health", AgentCheck.WARNING),
        ("gpu_monitoring.device.health", AgentCheck.CRITICAL),
        ("gpu_monitoring.nvml.can_connect", AgentCheck.OK),
        ("gpu_monitoring.nvml.can_connect", AgentCheck.CRITICAL),
        ("gpu_monitoring.kubelet.can_connect", AgentCheck.OK),
        ("gpu_monitoring.kubelet.can_connect", AgentCheck.WARNING),
        ("gpu_monitoring.kubelet.can_connect", AgentCheck.CRITICAL),
        ("gpu_monitoring.sidecar.can_connect", AgentCheck.OK),
        ("gpu_monitoring.sidecar.can_connect", AgentCheck.CRITICAL),
        ("gpu_monitoring.node.health", AgentCheck.OK),
        ("gpu_monitoring.node.health", AgentCheck.WARNING),
        ("gpu_monitoring.node.health", AgentCheck.CRITICAL),
    }
    assert seen == expected
