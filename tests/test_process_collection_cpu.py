"""What process collection keeps between runs to spare CPU never shows a process twice or a stale one.

Each device keeps the array a process query fills from one call to the next while its room's size
holds: NVML writes it anew each call, and only the entries it counts are read. A GPU whose list
outgrows the room, shrinks and empties lists exactly its live processes, with their own memory, in
every run, and newer queries the driver comes to refuse give way to an older one, of another
struct, with the same answer.
"""

from gpu_monitoring.nvml.processes import COMPUTE

from .attribution_support import MIB, processes
from .conftest import tag_dict
from .test_nvml_calls import dgx_variant

# GPU 0 of dgx-h100 keeps its trainer (41021) and gains waves of workers between runs (every 15 s).
WAVES = {  # first pid: (how many, start, end)
    50000: (40, 10, 40),  # t = 15, 30: past the first room (16)
    51000: (3, 40, 70),  # t = 45, 60: far fewer, in a room sized for 40
    52000: (25, 70, 85),  # t = 75: more again, in a room that shrank back
}
TRAINER = 41021


def memory_mib(pid):
    return 100 + pid % 1000 + (pid - 50000) // 10  # each worker its own


def waves(index, device):
    if index == 0:
        device["processes"] += [
            {"pid": pid, "name": "worker", "memory_mib": memory_mib(pid), "sm": 5, "start": start, "end": end}
            for first, (count, start, end) in WAVES.items() for pid in range(first, first + count)]


def expected_memory(now):
    """{pid: used memory in bytes} of the workers alive at `now`, as the scenario gives them."""
    return {pid: memory_mib(pid) * MIB
            for first, (count, start, end) in WAVES.items() if start <= now < end
            for pid in range(first, first + count)}


def gpu0(simulated, metric):
    """{pid: value} of a per-process metric on GPU 0 in the last run."""
    return {pid: stub.value for pid, stub in processes(simulated, metric).items()
            if tag_dict(stub.tags)["gpu_index"] == "0"}


def test_a_list_that_outgrows_its_room_and_shrinks_holds_exactly_the_live_processes(node, tmp_path):
    simulated = node(dgx_variant(tmp_path, "dgx-waves", waves))
    sizes = []
    for _ in range(8):  # t = 0 .. 105
        simulated.run()
        memory = gpu0(simulated, "process.memory.used")
        assert memory.pop(TRAINER) == 71200 * MIB
        assert memory == expected_memory(simulated.now), simulated.now
        assert simulated.values("processes.count")[0] == len(memory) + 1
        # Each listed process has its own samples (none before the first interval): none missing,
        # none of a process gone.
        used = gpu0(simulated, "process.sm_utilization")
        assert used.keys() == memory.keys() | {TRAINER}
        assert all(value > 0 for value in used.values()) == (simulated.now > 0), simulated.now
        sizes.append(len(memory))
    assert sizes == [0, 40, 40, 3, 3, 25, 0, 0]
    assert simulated.sim.failures == []


def test_newer_list_queries_the_driver_comes_to_refuse_give_way_to_the_oldest(node, tmp_path):
    simulated = node(dgx_variant(tmp_path, "dgx-waves", waves)).run(2)  # t = 15: 41 processes
    before = gpu0(simulated, "process.memory.used")
    # The simulated driver refuses _v3 and _v2 from now on: the unversioned query fills the smaller
    # v1 struct, in the room the newer ones left.
    simulated.sim.devices[0].spec.unsupported.extend(f"{COMPUTE}_v{n}" for n in (3, 2))
    simulated.sim.calls.clear()
    simulated.run()  # t = 30: the same 41 processes
    assert gpu0(simulated, "process.memory.used") == before
    assert [simulated.sim.calls[COMPUTE + suffix] for suffix in ("_v3", "_v2", "")] == [8, 1, 1]
    simulated.sim.calls.clear()
    simulated.run()  # t = 45: 4 processes, and the refused queries no longer asked of GPU 0
    assert gpu0(simulated, "process.memory.used").keys() == {TRAINER} | expected_memory(45).keys()
    assert [simulated.sim.calls[COMPUTE + suffix] for suffix in ("_v3", "_v2", "")] == [7, 0, 1]
    assert simulated.sim.failures == []
