"""How long a pod-resources answer is kept: `pod_cache_ttl` seconds, as the kubelet's pods are,
and no longer once the containers running on the GPUs change. A failure is never kept.

The reader is driven against the real gRPC server with a clock of its own; the check against a
simulated node whose pod starts its process on a GPU between two runs.
"""

from typing import Iterator

import pytest

from gpu_monitoring.kube.allocations import AllocationReader
from gpu_monitoring.simulator.pod_resources_server import PodResourcesServer
from gpu_monitoring.snapshot import Allocation

from .attribution_support import pod_tags, workloads
from .conftest import H100_PCIE_NODE
from .test_pod_resources import Clock

UUID = "GPU-0c6a1a54-4a4d-4c4b-9c8d-1a2b3c4d5e6f"
TRAINER = Allocation("ml", "trainer", "main", "nvidia.com/gpu", UUID)
TTL = 30.0


@pytest.fixture
def served(tmp_path) -> Iterator[PodResourcesServer]:
    server = PodResourcesServer(str(tmp_path / "kubelet.sock"), [TRAINER]).start()
    yield server
    server.stop()


def reader_of(server: PodResourcesServer, clock: Clock, ttl: float = TTL) -> AllocationReader:
    return AllocationReader(server.socket_path, clock=clock, ttl=ttl)


def test_an_answer_is_kept_for_the_ttl_while_the_users_stay(served: PodResourcesServer) -> None:
    clock = Clock()
    reader = reader_of(served, clock)
    users = frozenset({(0, "pod-uid-trainer")})
    for _ in range(3):
        assert reader.read(users).items == [TRAINER]
        clock.now += TTL / 3 - 1
    assert served.requests == 1
    clock.now += 3
    assert reader.read(users).items == [TRAINER]
    assert served.requests == 2


def test_new_users_of_the_gpus_ask_at_once(served: PodResourcesServer) -> None:
    clock = Clock()
    reader = reader_of(served, clock)
    assert reader.read(frozenset()).items == [TRAINER]
    other = Allocation("ml", "eval", "main", "nvidia.com/gpu", UUID)
    served.set_allocations([other])
    assert reader.read(frozenset({(0, "pod-uid-eval")})).items == [other]
    assert reader.read(frozenset()).items == [other]  # the pod ended: asked again
    assert served.requests == 3


def test_a_ttl_of_zero_asks_every_time(served: PodResourcesServer) -> None:
    reader = reader_of(served, Clock(), ttl=0)
    for _ in range(3):
        reader.read(frozenset())
    assert served.requests == 3


def test_a_failure_is_not_kept(served: PodResourcesServer) -> None:
    reader = reader_of(served, Clock())
    served.set_behaviour("rate_limited")
    failed = reader.read(frozenset())
    assert failed.source == "error" and "rate" in failed.error
    served.set_behaviour("ok")
    assert reader.read(frozenset()).items == [TRAINER]
    assert served.requests == 2


def test_a_kept_answer_changed_by_its_caller_is_not_changed_for_the_next(served: PodResourcesServer) -> None:
    reader = reader_of(served, Clock())
    reader.read(frozenset()).items.clear()
    assert reader.read(frozenset()).items == [TRAINER]
    assert served.requests == 1


# --- The check: a pod that starts work on its GPU is named in that very run ----------------

# GPU 0 is held from the start by `trainer`, whose process starts at t=45; GPU 1 runs `serving`.
SCENARIO = H100_PCIE_NODE + """
description: Two H100 PCIe; a pod holds GPU 0 idle until its process starts at t=45.
devices:
  - {model: h100, load: {utilization: 70, memory_used_mib: 1000},
     processes: [{pid: 200, name: trainer, memory_mib: 1000, start: 45}]}
  - {model: h100, load: {utilization: 40, memory_used_mib: 2000},
     processes: [{pid: 300, name: server, memory_mib: 2000}]}
kubernetes:
  pods:
    - name: trainer
      containers: [{name: main, devices: ["gpu:0"], processes: [200]}]
    - name: serving
      containers: [{name: main, devices: ["gpu:1"], processes: [300]}]
"""


@pytest.fixture
def scenario(tmp_path):
    path = tmp_path / "late-start.yaml"
    path.write_text(SCENARIO)
    return path


def test_steady_runs_ask_pod_resources_once_per_ttl(node, scenario) -> None:
    late = node(scenario)  # the default TTL, 30 s: these runs take far less
    resources = late.check.simulated_node.pod_resources
    late.run(3)  # t=0..30: nobody starts or stops on the GPUs
    assert resources.requests == 1


def test_a_process_starting_in_its_pod_asks_again_and_is_named_at_once(node, scenario) -> None:
    late = node(scenario)
    resources = late.check.simulated_node.pod_resources
    late.run(3)
    assert (0, "trainer") in workloads(late, "workload.gpus")
    late.run()  # t=45: the trainer's process starts on GPU 0
    assert resources.requests == 2
    (series,) = [s for s in late.series("process.memory.used") if "pid:200" in s.tags]
    assert pod_tags(series.tags)["pod_name"] == "trainer"
    late.run()
    assert resources.requests == 2
