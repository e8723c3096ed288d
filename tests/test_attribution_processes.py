"""Per-process metrics and what the Snapshot carries about processes and allocations (scenario dgx-h100)."""

import logging

import yaml

from gpu_monitoring.simulator.scenario import SCENARIO_DIR
from gpu_monitoring.snapshot import Snapshot

from .attribution_support import MIB, container_id, processes, workloads
from .conftest import tag_dict

TRITON_GPU = 3  # runs triton-server (15000 MiB) and python3 (7500 MiB) in one container
# GPU 5 runs nothing; GPU 7 only holds the memory of the process a failed pod left on it.
IDLE_GPUS = [5, 7]
# The pids NVML lists on each GPU.
PIDS = [[process["pid"] for process in device.get("processes", [])]
        for device in yaml.safe_load((SCENARIO_DIR / "dgx-h100.yaml").read_text())["devices"]]


def test_the_process_cap_keeps_the_largest_and_counts_the_rest(node):
    dgx = node("dgx-h100", max_processes_per_device=1).run(2)
    memory = processes(dgx, "process.memory.used")
    on_triton_gpu = {pid for pid, stub in memory.items() if tag_dict(stub.tags)["gpu_index"] == str(TRITON_GPU)}
    assert on_triton_gpu == {60211}
    assert memory[60211].value == 15000 * MIB
    assert 60388 not in processes(dgx, "process.sm_utilization")
    # Only GPU 3 runs more than one process; the others omit none.
    assert dgx.values("processes.omitted") == {index: (1 if index == TRITON_GPU else 0) for index in range(8)}
    (omitted,) = [s for s in dgx.series("processes.omitted") if s.value == 1]
    assert tag_dict(omitted.tags)["pod_name"] == "triton-resnet-6c9f8d7b5-q8wzt"
    # processes.count still counts every process.
    assert dgx.values("processes.count")[TRITON_GPU] == 2


def test_no_cap_no_omitted_series(node):
    dgx = node("dgx-h100", max_processes_per_device=0).run()
    assert dgx.series("processes.omitted") == []
    assert set(processes(dgx, "process.memory.used")) == {pid for pids in PIDS for pid in pids}


def test_the_process_cap_does_not_change_workloads(node):
    capped = node("dgx-h100", max_processes_per_device=1).run(2)
    memory = workloads(capped, "workload.memory.used")
    assert memory[(TRITON_GPU, "triton-resnet-6c9f8d7b5-q8wzt")] == (15000 + 7500) * MIB
    shared = node("t4-shared", max_processes_per_device=1).run(2)
    idle = workloads(shared, "workload.idle")
    # Only analytics-d and infer-4 run nothing; the others' processes were merely not reported one by one.
    assert {pod for (_, pod), value in idle.items() if value} == {"analytics-d", "infer-4"}


def test_no_new_process_samples_on_an_idle_gpu_is_no_error(node, caplog):
    caplog.set_level(logging.DEBUG)
    dgx = node("dgx-h100")
    per_run = []
    for _ in range(3):
        calls = dgx.sim.calls["nvmlDeviceGetProcessUtilization"]
        dgx.run()
        per_run.append(dgx.sim.calls["nvmlDeviceGetProcessUtilization"] - calls)
    # The GPUs that list a process are asked once a run, after the first run learnt the room the driver
    # wants for its sample buffer (INSUFFICIENT_SIZE, then asked again): idle GPU 7 too, whose process
    # ran no kernel (tests/test_nvml_calls.py: NOT_FOUND). GPU 5 lists no process and is not asked.
    listing = sum(1 for pids in PIDS if pids)
    assert per_run == [2 * listing, listing, listing]
    snapshot = dgx.check.source.read()
    for index in IDLE_GPUS:
        assert "nvmlDeviceGetProcessUtilization" not in snapshot.devices[index].unsupported
        assert dgx.values("processes.count")[index] == len(PIDS[index])
    on_idle = {pid: stub.value for pid, stub in processes(dgx, "process.sm_utilization").items()
               if int(tag_dict(stub.tags)["gpu_index"]) in IDLE_GPUS}
    assert on_idle == {pid: 0 for index in IDLE_GPUS for pid in PIDS[index]}
    assert dgx.check.warnings == []
    assert dgx.sim.failures == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert not any("ProcessUtilization" in r.getMessage() for r in caplog.records)


def test_snapshot_round_trip_keeps_allocations_and_process_owners(node):
    dgx = node("dgx-h100").run()
    snapshot = dgx.check.source.read()
    text = snapshot.to_json()
    back = Snapshot.from_json(text)
    assert back == snapshot
    assert back.to_json() == text
    assert back.allocations.source == "pod_resources" and back.allocations.error is None
    uuids = {d.index: d.uuid for d in back.devices}
    held = {(a.namespace, a.pod, a.container, a.resource_name, a.device_id) for a in back.allocations.items}
    assert held == {
        ("ml-training", "llm-pretrain-0", "trainer", "nvidia.com/gpu", uuids[0]),
        ("ml-training", "llm-pretrain-0", "trainer", "nvidia.com/gpu", uuids[1]),
        ("inference", "vllm-llama-70b-5d8f7c9b6-x2kqp", "vllm", "nvidia.com/gpu", uuids[2]),
        ("inference", "triton-resnet-6c9f8d7b5-q8wzt", "triton", "nvidia.com/gpu", uuids[3]),
        ("research", "jupyter-alice", "notebook", "nvidia.com/gpu", uuids[4]),
        ("research", "jupyter-bob", "notebook", "nvidia.com/gpu", uuids[5]),
        ("ml-training", "finetune-mistral-7b-0", "trainer", "nvidia.com/gpu", uuids[6]),
    }
    pods = {p["name"]: p for p in dgx.check.simulated_node.pods}
    owners = {p.pid: (p.name, p.container_id, p.pod_uid) for d in back.devices for p in d.processes}
    assert owners[52310] == ("vllm-engine", container_id(dgx, "vllm-llama-70b-5d8f7c9b6-x2kqp"),
                             pods["vllm-llama-70b-5d8f7c9b6-x2kqp"]["uid"])
    # The CRI-O container under the cgroupfs driver is found as well.
    assert owners[80417] == ("torchrun", container_id(dgx, "finetune-mistral-7b-0"),
                             pods["finetune-mistral-7b-0"]["uid"])
    # The process a failed pod left behind keeps its owner too: its cgroup still names the pod.
    assert owners[90114] == ("python3", container_id(dgx, "batch-eval-7f9c"), pods["batch-eval-7f9c"]["uid"])
    assert set(owners) == {pid for pids in PIDS for pid in pids}
    assert all(container and uid for _, container, uid in owners.values())


def test_snapshot_round_trip_keeps_a_pod_resources_failure(node):
    dgx = node("dgx-h100", pod_cache_ttl=0).run()  # pod-resources is asked again at once
    dgx.check.simulated_node.pod_resources.stop()
    back = Snapshot.from_json(dgx.check.source.read().to_json())
    assert back.allocations.source == "error"
    assert "does not exist" in back.allocations.error
    assert back.allocations.items == []
