"""How many NVML calls a steady-state run makes, and the one-call process queries behind the count."""

from collections import Counter

import yaml

from gpu_monitoring.nvml.fallbacks import FUNCTIONS as FALLBACK_FUNCTIONS
from gpu_monitoring.simulator.scenario import resolve

from .attribution_support import processes
from .conftest import SimulatedNode, tag_dict

MAX_CALLS_PER_GPU = 20
# Asked once a run for the whole node, whatever its GPUs: the event drain.
NODE_FUNCTIONS = {"nvmlEventSetWait_v2"}
PROCESS_QUERIES = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v3",
                   "nvmlDeviceGetProcessUtilization")
# dgx-h100's GPUs that list a process (GPU 7's is left over from a failed pod, and runs nothing): the
# GPUs asked for process samples.
LISTING = sum(1 for device in yaml.safe_load(resolve("dgx-h100").read_text())["devices"] if device.get("processes"))


def dgx_variant(tmp_path, name, devices):
    """dgx-h100 with devices changed by `devices(index, device)`, without Kubernetes."""
    raw = yaml.safe_load(resolve("dgx-h100").read_text())
    raw.pop("kubernetes")
    for index, device in enumerate(raw["devices"]):
        devices(index, device)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def pids_on(simulated, metric, gpu):
    return {pid for pid, stub in processes(simulated, metric).items() if tag_dict(stub.tags)["gpu_index"] == str(gpu)}


def eight_processes(index, device):
    device["processes"] = [{"pid": 20000 + 100 * index + n, "name": "python3", "memory_mib": 4000} for n in range(8)]
    device["load"] = dict(device["load"], utilization=70, memory_used_mib=32000)


def steady_calls(simulated, runs=3):
    """Calls per GPU per run over `runs` runs after a warm-up run."""
    simulated.run()
    simulated.sim.calls.clear()
    simulated.run(runs)
    gpus = len(simulated.sim.devices)
    return Counter({function: count / runs / gpus for function, count in simulated.sim.calls.items()})


def test_dgx_h100_calls_per_gpu_per_run(node):
    calls = steady_calls(node("dgx-h100"))
    assert sum(calls.values()) <= MAX_CALLS_PER_GPU, calls
    # One batch of fields, power included; each process query once, and only where it can answer.
    assert calls["nvmlDeviceGetFieldValues"] == 1
    assert calls["nvmlDeviceGetPowerUsage"] == calls["nvmlDeviceGetEnforcedPowerLimit"] == 0
    assert calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
    assert calls["nvmlDeviceGetProcessUtilization"] == LISTING / 8  # GPU 5 lists no process
    assert calls["nvmlDeviceGetMPSComputeRunningProcesses_v3"] == 0  # no MPS server
    # Nothing is asked twice of a GPU in one run, but the four clocks.
    assert {f for f, per_gpu in calls.items() if per_gpu > 1} == {"nvmlDeviceGetClockInfo"}
    assert calls["nvmlDeviceGetClockInfo"] == 4


def gpu_and_node_calls(calls: Counter, gpus: int):
    """Calls made of the GPUs, per GPU, and the node's own calls per run."""
    return (sum(n for f, n in calls.items() if f not in NODE_FUNCTIONS),
            sum(n * gpus for f, n in calls.items() if f in NODE_FUNCTIONS))


def test_eight_processes_on_every_gpu(node, tmp_path):
    crowded = node(dgx_variant(tmp_path, "dgx-8x8", eight_processes))
    calls = steady_calls(crowded)
    # Every GPU busy: 18 calls each (its NVLink fabric once, its PCIe link not at all while the link
    # does not retrain, its MIG mode not at all while it lists processes), and the node's event drain
    # once a run.
    assert gpu_and_node_calls(calls, 8) == (18, 1), calls
    assert calls["nvmlDeviceGetMigMode"] == 0
    assert calls["nvmlDeviceGetGpuFabricInfoV"] == 1 and calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 0
    assert calls["nvmlDeviceGetComputeRunningProcesses_v3"] == calls["nvmlDeviceGetProcessUtilization"] == 1
    assert crowded.values("processes.count") == dict.fromkeys(range(8), 8)
    assert len(processes(crowded, "process.sm_utilization")) == 64


def test_every_call_of_the_full_profile_with_eight_processes_a_gpu(node, tmp_path):
    # metrics_profile full, 8 processes on each GPU, every call counted: field fallbacks (none here)
    # and each GPU's share of the node's event drain included. Two below the limit: MIG mode is not
    # asked of a GPU that runs processes (collectors.mig), and nothing a run asks grows with them.
    calls = steady_calls(node(dgx_variant(tmp_path, "dgx-8x8-full", eight_processes), metrics_profile="full"), runs=4)
    assert sum(calls.values()) == 18 + 1 / 8 <= MAX_CALLS_PER_GPU - 1.5, calls
    assert not set(calls) & FALLBACK_FUNCTIONS


def test_a_process_count_that_jumps_between_runs_is_listed_whole(node, tmp_path):
    def jump(index, device):
        if index == 0:
            device["processes"] += [{"pid": 30000 + n, "name": "worker", "memory_mib": 100, "start": 10}
                                    for n in range(39)]

    jumping = node(dgx_variant(tmp_path, "dgx-jump", jump)).run()
    assert jumping.values("processes.count")[0] == 1
    jumping.sim.calls.clear()
    jumping.run()
    # 40 processes outgrow the room the first run's one left: NVML says INSUFFICIENT_SIZE, and the
    # query asks again with room for them. The samples' room, sized for the driver's buffer of 72
    # the first run, has room to spare and never shrinks.
    assert jumping.values("processes.count")[0] == 40
    listed = {41021} | {30000 + n for n in range(39)}
    assert pids_on(jumping, "process.memory.used", 0) == pids_on(jumping, "process.sm_utilization", 0) == listed
    # Once a GPU (the process list) or a GPU that lists a process (the samples), and the list once
    # more on GPU 0.
    assert jumping.sim.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 8 + 1
    assert jumping.sim.calls["nvmlDeviceGetProcessUtilization"] == LISTING
    jumping.sim.calls.clear()
    jumping.run()
    assert jumping.sim.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 8
    assert jumping.sim.calls["nvmlDeviceGetProcessUtilization"] == LISTING
    assert jumping.sim.failures == []


def test_a_listed_process_without_samples_is_no_error(node, tmp_path):
    def quiet(index, device):
        if index == 5:
            device["processes"] = [{"pid": 55555, "name": "python3", "memory_mib": 100, "sm": 0}]

    simulated = node(dgx_variant(tmp_path, "dgx-quiet", quiet))
    simulated.run()
    simulated.sim.calls.clear()
    simulated.run(2)
    # GPU 5 lists a process that ran no kernel: NOT_FOUND, asked again every run, never "unsupported";
    # it is asked as every other GPU that lists one.
    assert simulated.sim.calls["nvmlDeviceGetProcessUtilization"] == 2 * (LISTING + 1)
    assert processes(simulated, "process.sm_utilization")[55555].value == 0
    assert "nvmlDeviceGetProcessUtilization" not in simulated.check.source.read().devices[5].unsupported


def test_a_gpu_that_goes_idle_and_comes_back(node, tmp_path):
    def comes_back(index, device):
        if index == 7:
            device["load"] = {"utilization": 40}
            device["processes"] = [{"pid": 70001, "name": "python3", "memory_mib": 1000, "end": 20},
                                   {"pid": 70002, "name": "python3", "memory_mib": 1000, "start": 50}]

    # t = 0: each busy GPU's first sample query learns the room the driver's sample buffer needs.
    simulated = node(dgx_variant(tmp_path, "dgx-idle", comes_back)).run()
    asked = []
    for _ in range(5):  # t = 15 (70001 runs), 30, 45 (nothing runs), 60, 75 (70002 runs)
        before = simulated.sim.calls["nvmlDeviceGetProcessUtilization"]
        simulated.run()
        asked.append(simulated.sim.calls["nvmlDeviceGetProcessUtilization"] - before - 6)
        used = processes(simulated, "process.sm_utilization")
        assert (70001 in used, 70002 in used) == {0: (1, 0), 3: (0, 1), 4: (0, 1)}.get(len(asked) - 1, (0, 0))
    assert asked == [1, 0, 0, 1, 1]
    assert processes(simulated, "process.sm_utilization")[70002].value > 0


def test_mps_clients_are_listed_where_an_mps_server_runs(node):
    t4 = node("t4-shared").run()
    t4.sim.calls.clear()
    t4.run(2)
    # GPU 1 runs the MPS server; GPU 0's processes are none of it and it is not asked for clients.
    assert t4.sim.calls["nvmlDeviceGetMPSComputeRunningProcesses_v3"] == 2
    snapshot = t4.check.source.read()
    assert {p.pid: p.kind for p in snapshot.devices[1].processes} == {3300: "compute", 3311: "mps",
                                                                      3312: "mps", 3313: "mps"}
    assert {p.kind for p in snapshot.devices[0].processes} == {"compute"}


def test_mps_is_asked_where_process_names_cannot_be_read(node, tmp_path):
    t4 = node("t4-shared", proc_root=str(tmp_path)).run()
    t4.sim.calls.clear()
    t4.run(2)
    # Without names any compute process may be the MPS server: every GPU that lists one is asked.
    assert t4.sim.calls["nvmlDeviceGetMPSComputeRunningProcesses_v3"] == 2 * 2
    kinds = Counter(p.kind for p in t4.check.source.read().devices[1].processes)
    assert kinds == {"compute": 1, "mps": 3}


def test_the_field_refusing_driver_adds_only_fallback_calls(node):
    """What h100-no-fields calls beyond dgx-h100 is the fallbacks' (the bench counts them apart),
    and the rest stays within the limit."""
    refusing_node = node("h100-no-fields")
    refusing = steady_calls(refusing_node)
    whole = steady_calls(node("dgx-h100"))
    added = {f for f in refusing if not whole.get(f)}
    assert added and added <= FALLBACK_FUNCTIONS, added - FALLBACK_FUNCTIONS
    besides_fallbacks = Counter({f: n for f, n in refusing.items() if f not in FALLBACK_FUNCTIONS})
    # The node's event drain asks once more for each event it finds, and this node has XIDs.
    gpu_calls, _ = gpu_and_node_calls(besides_fallbacks, len(refusing_node.sim.devices))
    assert gpu_calls <= MAX_CALLS_PER_GPU, besides_fallbacks


def test_a_profile_does_not_read_what_it_does_not_send(node, aggregator):
    """Reads that give only metrics the profile leaves out are not made; health is judged alike."""
    calls, health = {}, {}
    for profile in ("full", "standard"):
        aggregator.reset()
        calls[profile] = steady_calls(node("dgx-h100", metrics_profile=profile))
        health[profile] = {index: (stub.status, stub.message) for index, stub in SimulatedNode.health().items()}
    full, standard = calls["full"], calls["standard"]
    fewer = {function for function in full if standard[function] < full[function]}
    assert fewer == {"nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
                     "nvmlDeviceGetBAR1MemoryInfo", "nvmlDeviceGetClockInfo", "nvmlDeviceGetPerformanceState"}
    assert standard["nvmlDeviceGetClockInfo"] == 1  # the SM clock; not memory, graphics nor video
    assert not {function for function in standard if standard[function] > full[function]}
    assert health["standard"] == health["full"] and len(health["full"]) == 8
