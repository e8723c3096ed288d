"""The kernel's record in local mode: an application XID tied to the pod whose process it hit, an XID
raised while the Agent was down counted once after its restart and held from its own time, history
before the driver's last load not judged, NVSwitch, ConnectX and PCIe AER faults in node and GPU
health, and a kernel log that cannot be read said as a WARNING."""

import os

import yaml
from datadog_checks.base import AgentCheck
from datadog_checks.base.stubs import aggregator as _aggregator

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.health.kernel_memory import KernelMemory
from gpu_monitoring.node.kernel_events import KernelEvents
from gpu_monitoring.node.kernel_log import KernelLog
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.node import simulated_node
from gpu_monitoring.simulator.proc_root import build_proc_root, cgroup_text
from gpu_monitoring.simulator.scenario import resolve
from gpu_monitoring.snapshot import Event

from .conftest import H100_PCIE_NODE, HEALTH, INTERVAL, tag_dict

NODE_HEALTH = "gpu_monitoring.node.health"


def with_faults(tmp_path, scenario, faults):
    raw = yaml.safe_load(resolve(scenario).read_text())
    raw["faults"] = faults
    path = tmp_path / f"{scenario}-with-faults.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def xid_series(code):
    return [tag_dict(stub.tags) | {"value": stub.value} for stub in _aggregator.metrics("gpu_monitoring.xid_errors")
            if f"xid:{code}" in stub.tags]


def health_of(index, name=HEALTH):
    (stub,) = [s for s in _aggregator.service_checks(name) if index is None or f"gpu_index:{index}" in s.tags]
    return stub


def test_an_application_xid_carries_the_pod_whose_process_it_hit(node, tmp_path):
    # GPU 2 of the DGX H100 is vLLM's, pid 52310; GPU 0 and 1 are a training job's.
    dgx = node(with_faults(tmp_path, "dgx-h100", [{"at": 10, "kind": "xid", "device": 2, "xid": 13}])).run(2)
    (series,) = xid_series(13)
    assert (series["pod_name"], series["kube_namespace"], series["value"]) == (
        "vllm-llama-70b-5d8f7c9b6-x2kqp", "inference", 1)
    (event,) = _aggregator.events
    assert event["msg_title"].startswith("XID 13 on GPU 2") and event["msg_title"].endswith(
        "— pod inference/vllm-llama-70b-5d8f7c9b6-x2kqp (vllm-engine, pid 52310)")
    assert "pod_name:vllm-llama-70b-5d8f7c9b6-x2kqp" in event["tags"]
    # An application XID is the workload's, never held on the GPU.
    dgx.run()
    assert health_of(2).status == AgentCheck.OK


TIMELINE = H100_PCIE_NODE + """
devices:
  - {model: h100, load: {utilization: 50}, processes: [{pid: 4711, name: python, memory_mib: 20000}]}
slurm:
  jobs:
    - {id: 48213, name: llama3-pretrain, user: alice, uid: 1001, processes: [4711]}
faults:
  - {at: 10, kind: xid, device: 0, xid: 13}
  - {at: 40, kind: xid, device: 0, xid: 48}
"""


def restarted_at(path, start, check_id="gpu_monitoring:restart"):
    """A check as the Agent makes it again after a restart: the same instance ID (its persistent cache),
    on the node as it is at scenario time `start` (NVML knows nothing of what came before; the kernel does)."""
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{"simulate": path, "metrics_profile": "full"}])
    check.check_id = check_id
    check.simulated_node = simulated_node(path, SimClock(speed=0, start=start))
    return check


def run(check, advance=0):
    if advance:
        check.simulated_node.nvml.advance(advance)
    _aggregator.reset()
    assert check.run() == ""


def test_an_xid_raised_while_the_agent_was_down_is_counted_once_and_held_from_its_own_time(tmp_path):
    path = tmp_path / "timeline.yaml"
    path.write_text(TIMELINE)
    first = restarted_at(str(path), 0)
    try:
        run(first)
        run(first, INTERVAL)  # t=15: XID 13, from NVML and the kernel: one
        assert [(s["xid"], s["slurm_job_id"], s["value"]) for s in xid_series(13)] == [("13", "48213", 1)]
    finally:
        first.cancel()
    # The Agent is down from t=20 to t=50: XID 48 (t=40) reaches no NVML event set.
    second = restarted_at(str(path), 50)
    try:
        run(second)
        assert xid_series(13) == []  # read before the restart: not again
        (series,) = xid_series(48)
        assert series["value"] == 1
        (event,) = _aggregator.events
        assert event["msg_title"].startswith("XID 48 on GPU 0")
        assert "From the kernel's record: NVML raised no event for it" in event["msg_text"]
        boot_time = second.simulated_node.boot_time
        fault_time = second.simulated_node.wall_time() - 10  # t=40
        assert abs(event["timestamp"] - fault_time) <= 1 and boot_time < event["timestamp"]
        health = health_of(0)
        assert health.status == AgentCheck.CRITICAL and "[from the kernel's record]" in health.message
        run(second, INTERVAL)
        held = health_of(0)
        assert held.status == AgentCheck.CRITICAL and "(held since " in held.message
    finally:
        second.cancel()


def test_an_xid_from_before_the_drivers_last_load_is_history(tmp_path):
    path = tmp_path / "timeline.yaml"
    path.write_text(TIMELINE.replace("  - {at: 40, kind: xid, device: 0, xid: 48}\n",
                                     "  - {at: 40, kind: xid, device: 0, xid: 48}\n"
                                     "  - {at: 45, kind: driver_reload}\n"))
    check = restarted_at(str(path), 50)  # first started after the reload: the log holds both
    try:
        run(check)
        assert [s["value"] for s in xid_series(48)] == [1]  # counted: it happened
        assert health_of(0).status == AgentCheck.OK  # but the reload after it answered it
    finally:
        check.cancel()


def test_nvswitch_connectx_and_aer_faults_reach_node_and_gpu_health(node):
    b200 = node("hgx-b200").run_until(60)
    node_health = health_of(None, NODE_HEALTH)
    assert node_health.status == AgentCheck.WARNING and "NVSwitch 0000:07:00.0: SXid 20009 (non-fatal)" in \
        node_health.message
    del b200
    faults = node("faults").run_until(60)
    gpu4 = health_of(4)
    assert "12 corrected PCIe errors (AER) since the last run" in gpu4.message
    (corrected,) = faults.series("pcie.aer.corrected")
    assert corrected.value == 12 and "gpu_index:4" in corrected.tags
    faults.run()  # t=75: the ConnectX of port mlx5_2/1 failed at t=65
    node_health = health_of(None, NODE_HEALTH)
    assert node_health.status == AgentCheck.CRITICAL and "reported a fatal error" in node_health.message
    assert "port mlx5_2/1" in node_health.message


def test_a_kernel_log_that_cannot_be_read_is_a_warning_that_says_the_fix(node, tmp_path):
    node("gpu-missing", kernel_log=str(tmp_path / "no-kern.log")).run()
    node_health = health_of(None, NODE_HEALTH)
    assert "the kernel's log is not read: cannot read the kernel's log" in node_health.message
    assert "set kernel_log to none" in node_health.message
    # Without its record the missing GPU is still told, by the PCI bus alone: CRITICAL for that, not the log.
    assert "0000:c1:00.0 is bound to nvidia but the driver did not set it up" in node_health.message


# --- the process a kernel line names ----------------------------------------------------------


BOOT = "6f3c0f52-5a8e-4a07-9f0c-1d2e3f405162"
XID_LINE = "NVRM: Xid (PCI:0000:9b:00): 13, pid={pid}, name=python, Graphics Exception"


def kernel_events(tmp_path, processes, pid, usec):
    proc = build_proc_root(tmp_path / "proc", processes, boot_time=1_795_800_000)
    log = tmp_path / "kmsg"
    log.write_text(f"4,0,{usec},-;{XID_LINE.format(pid=pid)}\n")
    return KernelEvents(KernelLog(str(log), str(proc), BOOT), str(proc)).read()


CONTAINER = "9f2c" * 16
POD = "3d1f7a52-91c3-4e0b-8f5e-2a6b0c9d4e17"


def test_a_live_pid_gives_its_container_and_pod(tmp_path):
    process = {"pid": 4711, "name": "python", "container_id": CONTAINER, "pod_uid": POD, "start_time": 100}
    (event,) = kernel_events(tmp_path, [process], 4711, usec=50_000_000)
    assert (event["pid"], event["process_name"], event["container_id"], event["pod_uid"]) == (
        4711, "python", CONTAINER, POD)
    assert cgroup_text(CONTAINER, POD).strip() in (tmp_path / "proc" / "4711" / "cgroup").read_text()


def test_a_pid_gone_before_the_line_was_read_keeps_the_name_the_driver_gave(tmp_path):
    (event,) = kernel_events(tmp_path, [], 4711, usec=50_000_000)
    assert (event["pid"], event["process_name"], event.get("container_id"), event.get("pod_uid")) == (
        4711, "python", None, None)


def test_a_pid_the_kernel_gave_another_process_since_is_not_its_owner(tmp_path):
    # Started (clock ticks since boot) after the line was written: the pid was reused.
    later = 100 * os.sysconf("SC_CLK_TCK")
    process = {"pid": 4711, "name": "bash", "container_id": CONTAINER, "pod_uid": POD, "start_time": later}
    (event,) = kernel_events(tmp_path, [process], 4711, usec=50_000_000)
    assert (event["process_name"], event.get("container_id")) == ("python", None)


def test_what_the_log_told_is_forgotten_at_a_new_boot():
    memory = KernelMemory()
    told = Event(None, "init_failed", 0, 10.0, pci_bus_id="00000000:C1:00.0", source="kernel",
                 detail="0x26:0x56:1474")
    assert memory.learn([told], "boot-1")
    assert memory.init_failures == {"00000000:C1:00.0": "RmInitAdapter failed! 0x26:0x56:1474"}
    assert memory.learn([], "boot-2") and memory.init_failures == {}
    again = KernelMemory.loads(memory.dumps())
    assert again == memory
