"""The kubelet PodResources client against a real gRPC server on a unix socket.

The server encodes with the official protobuf runtime, so these tests check the client's own
wire-format decoder against real protobuf bytes.
"""

import re
import socket
import time
from concurrent import futures
from typing import Iterator, List

import grpc
import pytest

from gpu_monitoring.kube import grpc_channels
from gpu_monitoring.kube.allocations import ADVERTISED_TTL, AllocationReader
from gpu_monitoring.kube.device_ids import DEFAULT_RESOURCES, DeviceRef, matches_resource, parse_device_id
from gpu_monitoring.kube.pod_resources import (
    ALLOCATABLE_METHOD,
    LIST_METHOD,
    Allocation,
    LastAnswer,
    PodResourcesError,
    decode_allocatable,
    decode_allocations,
    list_allocatable,
    list_allocations,
)
from gpu_monitoring.simulator.pod_resources_server import PodResourcesServer
from gpu_monitoring.snapshot import Advertised, Allocations, Node, Snapshot

from .pod_resources_support import assert_every_truncation_is_rejected_or_a_whole_pod_prefix, raw_list

UUID = "GPU-5d5f9d2a-3c1b-4f5e-9a7b-2c8d0e1f2a3b"
MIG_UUID = "MIG-0b1c2d3e-4f50-5a6b-8c7d-9e0f1a2b3c4d"


def alloc(namespace: str, pod: str, container: str, resource: str, device_id: str) -> Allocation:
    return Allocation(namespace, pod, container, resource, device_id)


TRAINING = [
    alloc("ml", "trainer-0", "main", "nvidia.com/gpu", UUID),
    alloc("ml", "trainer-0", "main", "nvidia.com/gpu", "GPU-11111111-2222-3333-4444-555555555555"),
    alloc("ml", "trainer-0", "main", "cpu-pinning.example/cores", "0-3"),
    alloc("ml", "trainer-0", "sidecar", "nvidia.com/gpu.shared", UUID + "::3"),
    alloc("ml", "notebook", "jupyter", "nvidia.com/mig-3g.40gb", MIG_UUID),
    alloc("ml", "notebook", "jupyter", "example.com/gpu-vf", "vf-7"),
    alloc("serving", "trainer-0", "main", "nvidia.com/gpu.shared", UUID + "::0"),
    alloc("serving", "api", "server", "nvidia.com/mig-1g.10gb.shared", MIG_UUID + "::1"),
]
GPU_ONLY = [a for a in TRAINING if a.resource_name.startswith("nvidia.com/")]


# What the device plugins advertise on the node TRAINING runs on: 8 replicas of the shared GPU,
# the whole second GPU, two MIG instances and another vendor's devices.
ADVERTISED = (
    [Advertised("nvidia.com/gpu", "GPU-11111111-2222-3333-4444-555555555555")]
    + [Advertised("nvidia.com/gpu.shared", f"{UUID}::{n}") for n in range(8)]
    + [Advertised("nvidia.com/mig-3g.40gb", MIG_UUID), Advertised("nvidia.com/mig-1g.10gb.shared", MIG_UUID + "::1")]
    + [Advertised("cpu-pinning.example/cores", "0-3"), Advertised("example.com/gpu-vf", "vf-7")]
)
ADVERTISED_GPUS = [a for a in ADVERTISED if a.resource_name.startswith("nvidia.com/")]


@pytest.fixture
def socket_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    # A short directory: unix socket paths are limited to 107 bytes, and test names are long.
    return str(tmp_path_factory.mktemp("pr") / "kubelet.sock")


@pytest.fixture
def server(socket_path: str) -> Iterator[PodResourcesServer]:
    with PodResourcesServer(socket_path, TRAINING, ADVERTISED) as running:
        yield running


@pytest.mark.parametrize(
    "raw, expected",
    [
        (UUID, DeviceRef(UUID, uuid=UUID)),
        (UUID + "::0", DeviceRef(UUID + "::0", uuid=UUID, replica=0)),
        (UUID + "::12", DeviceRef(UUID + "::12", uuid=UUID, replica=12)),
        (MIG_UUID, DeviceRef(MIG_UUID, uuid=MIG_UUID)),
        (MIG_UUID + "::2", DeviceRef(MIG_UUID + "::2", uuid=MIG_UUID, replica=2)),
        (f"MIG-{UUID}/7/0", DeviceRef(f"MIG-{UUID}/7/0", uuid=UUID, gpu_instance=7, compute_instance=0)),
        ("nvidia0", DeviceRef("nvidia0", minor=0)),
        ("nvidia13", DeviceRef("nvidia13", minor=13)),
        ("nvidia2/vgpu5", DeviceRef("nvidia2/vgpu5", minor=2, vgpu=5)),
        ("nvidia1/gi3", DeviceRef("nvidia1/gi3", minor=1, gpu_instance=3)),
    ],
)
def test_every_device_id_shape_is_parsed(raw: str, expected: DeviceRef) -> None:
    assert parse_device_id(raw) == expected


@pytest.mark.parametrize(
    "raw",
    ["", "GPU-", "GPU-zz", "gpu-abc", f" {UUID}", UUID + "::", UUID + "::x", f"MIG-{UUID}/7", "nvidia", "nvidia0/mig1"],
)
def test_an_unknown_device_id_raises_naming_it(raw: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(raw))):
        parse_device_id(raw)


def test_resource_patterns_are_case_sensitive_globs() -> None:
    for name in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb.shared"):
        assert matches_resource(name, DEFAULT_RESOURCES)
    for name in ("nvidia.com/gpus", "NVIDIA.com/gpu", "example.com/gpu", "cpu"):
        assert not matches_resource(name, DEFAULT_RESOURCES)
    assert matches_resource("example.com/gpu-vf", ["example.com/gpu*"])


def test_allocations_round_trip_through_the_real_server(server: PodResourcesServer, socket_path: str) -> None:
    assert list_allocations(socket_path) == GPU_ONLY
    extra = list_allocations(socket_path, [*DEFAULT_RESOURCES, "example.com/gpu*"])
    assert extra == [a for a in TRAINING if a.resource_name != "cpu-pinning.example/cores"]
    assert list_allocations(socket_path, ["*"]) == TRAINING
    assert server.requests == 3


def test_fields_the_client_does_not_read_are_skipped(socket_path: str) -> None:
    with PodResourcesServer(socket_path, TRAINING, extra_fields=True):
        payload = raw_list(socket_path)
        assert list_allocations(socket_path, ["*"]) == TRAINING
    # The extra fields really were on the wire: once on the response, on each pod, container and device list.
    pods = {(a.namespace, a.pod) for a in TRAINING}
    containers = {(a.namespace, a.pod, a.container) for a in TRAINING}
    device_lists = {(a.namespace, a.pod, a.container, a.resource_name) for a in TRAINING}
    assert payload.count(b"newer kubelet") == 1 + len(pods) + len(containers) + len(device_lists)
    assert b"\xc0>" + b"\xff" * 9 + b"\x01" in payload  # field 1000 = -1: a 10-byte varint
    assert b"\x1a\x02\x0a\x00" in payload  # ContainerDevices.topology: one NUMA node, ID 0
    assert decode_allocations(payload) == TRAINING


def test_served_allocations_change_while_running(server: PodResourcesServer, socket_path: str) -> None:
    server.set_allocations(TRAINING[:1])
    assert list_allocations(socket_path) == TRAINING[:1]
    server.set_allocations([])
    assert list_allocations(socket_path) == []


def test_one_channel_serves_every_run_and_a_restarted_kubelet_is_reached_at_once(socket_path: str) -> None:
    with PodResourcesServer(socket_path, TRAINING[:1], ADVERTISED):
        assert list_allocations(socket_path) == TRAINING[:1]
        kept = grpc_channels.unary_unary(grpc, socket_path, [], LIST_METHOD)
        assert list_allocations(socket_path) == TRAINING[:1]
        assert grpc_channels.unary_unary(grpc, socket_path, [], LIST_METHOD) is kept
    # The kubelet restarts: a new socket at the same path, which the first call after reaches.
    with PodResourcesServer(socket_path, TRAINING[:2], ADVERTISED):
        assert list_allocations(socket_path) == TRAINING[:2]
        assert grpc_channels.unary_unary(grpc, socket_path, [], LIST_METHOD) is not kept


def test_a_failed_call_drops_its_channel(server: PodResourcesServer, socket_path: str) -> None:
    list_allocations(socket_path)
    kept = grpc_channels.unary_unary(grpc, socket_path, [], LIST_METHOD)
    server.set_behaviour("rate_limited")
    with pytest.raises(PodResourcesError):
        list_allocations(socket_path)
    server.set_behaviour("ok")
    assert list_allocations(socket_path) == GPU_ONLY
    assert grpc_channels.unary_unary(grpc, socket_path, [], LIST_METHOD) is not kept


def test_a_missing_socket_says_what_to_mount(socket_path: str) -> None:
    with pytest.raises(PodResourcesError) as raised:
        list_allocations(socket_path)
    assert raised.value.reason == "missing"
    assert socket_path in str(raised.value) and "/var/lib/kubelet/pod-resources" in str(raised.value)


def test_a_socket_nobody_listens_on_is_unavailable(socket_path: str) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(socket_path)
    stale.close()
    with pytest.raises(PodResourcesError) as raised:
        list_allocations(socket_path)
    assert raised.value.reason == "unavailable"


@pytest.mark.parametrize(
    "behaviour, reason, words",
    [
        ("unimplemented", "unimplemented", "feature gate"),
        ("rate_limited", "rate_limited", "rate-limiting"),
        ("garbage", "invalid", "undecodable pod-resources response"),
    ],
)
def test_kubelet_failures_get_their_reason(
    server: PodResourcesServer, socket_path: str, behaviour: str, reason: str, words: str
) -> None:
    server.set_behaviour(behaviour)
    with pytest.raises(PodResourcesError, match=words) as raised:
        list_allocations(socket_path)
    assert raised.value.reason == reason
    server.set_behaviour("ok")
    assert list_allocations(socket_path) == GPU_ONLY


def test_a_slow_kubelet_times_out(socket_path: str) -> None:
    with PodResourcesServer(socket_path, TRAINING, behaviour="slow", delay=1.0) as server:
        started = time.monotonic()
        with pytest.raises(PodResourcesError) as raised:
            list_allocations(socket_path, timeout=0.2)
        assert time.monotonic() - started < 0.9
        assert raised.value.reason == "timeout"
        assert server.requests == 1


def test_any_other_grpc_status_is_an_error(socket_path: str) -> None:
    def deny(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "not for you")

    service, method = LIST_METHOD.strip("/").split("/")
    handler = grpc.method_handlers_generic_handler(service, {method: grpc.unary_unary_rpc_method_handler(deny)})
    denying = grpc.server(futures.ThreadPoolExecutor(max_workers=1), handlers=(handler,))
    denying.add_insecure_port("unix:" + socket_path)
    denying.start()
    try:
        with pytest.raises(PodResourcesError, match="PERMISSION_DENIED: not for you") as raised:
            list_allocations(socket_path)
        assert raised.value.reason == "error"
    finally:
        denying.stop(None).wait()


def test_the_server_cleans_up_its_socket(socket_path: str) -> None:
    with PodResourcesServer(socket_path):
        assert list_allocations(socket_path) == []
    with pytest.raises(PodResourcesError, match="does not exist"):
        list_allocations(socket_path)
    with pytest.raises(ValueError, match="expected one of ok, "):
        PodResourcesServer(socket_path, behaviour="flaky")


def test_every_truncation_is_rejected_or_a_whole_pod_prefix(server: PodResourcesServer, socket_path: str) -> None:
    payload = raw_list(socket_path)
    assert_every_truncation_is_rejected_or_a_whole_pod_prefix(payload)
    with pytest.raises(PodResourcesError, match="past the end"):
        decode_allocations(payload[:-1])


@pytest.mark.parametrize(
    "payload, problem",
    [
        (b"\x0a", "truncated varint at byte 1 of a ListPodResourcesResponse"),
        (b"\x0a\x05ab", "field 1 runs past the end"),
        (b"\x0a\x02\x0a\x80", "truncated varint at byte 1 of a PodResources"),
        (b"\x80", "truncated varint"),
        (b"\xff" * 11, "varint longer than 10 bytes"),
        (b"\x00\x00", "field number 0"),
        (b"\x0b\x0c", "unsupported wire type 3"),
        (b"\x11\x00\x00", "field 2 runs past the end"),
        (b"\x0a\x03\x0a\x01\xff", "PodResources.name is not UTF-8"),
    ],
)
def test_malformed_bytes_are_rejected_clearly(payload: bytes, problem: str) -> None:
    with pytest.raises(PodResourcesError, match=re.escape(problem)) as raised:
        decode_allocations(payload)
    assert raised.value.reason == "invalid"


def test_unknown_fields_of_every_wire_type_are_skipped() -> None:
    device = b"\x0a\x0envidia.com/gpu" + b"\x12\x07nvidia0" + b"\x08\x01"
    container = b"\x0a\x01c" + b"\x12" + bytes([len(device)]) + device + b"\x19" + bytes(8)
    pod = b"\x0a\x01p" + b"\x12\x02ns" + b"\x1a" + bytes([len(container)]) + container + b"\xa5\x06" + bytes(4)
    # Field 1 as a varint is a known number with an unexpected wire type: skipped like any unknown field.
    response = b"\x08\x96\x01" + b"\x0a" + bytes([len(pod)]) + pod + b"\xf8\xff\xff\xff\x0f\x01"
    assert decode_allocations(response) == [alloc("ns", "p", "c", "nvidia.com/gpu", "nvidia0")]


# --- GetAllocatableResources -----------------------------------------------------------


def raw_allocatable(socket_path: str) -> bytes:
    with grpc.insecure_channel("unix://" + socket_path) as channel:
        return channel.unary_unary(ALLOCATABLE_METHOD)(b"", timeout=5)


def test_advertised_devices_round_trip_through_the_real_server(server: PodResourcesServer, socket_path: str) -> None:
    assert list_allocatable(socket_path) == ADVERTISED_GPUS
    assert list_allocatable(socket_path, ["*"]) == ADVERTISED
    assert server.allocatable_requests == 2 and server.requests == 0


def test_the_nodes_cpus_memory_and_newer_fields_are_skipped(socket_path: str) -> None:
    with PodResourcesServer(socket_path, advertised=ADVERTISED, extra_fields=True):
        payload = raw_allocatable(socket_path)
    # The CPU IDs (packed, field 2) and memory (field 3) really were on the wire, and so were the extra fields.
    assert b"\x12\x06\x00\x01\x02\x03\x82\x01" in payload
    assert b"\x0a\x06memory" in payload
    assert payload.count(b"newer kubelet") == 1 + len({a.resource_name for a in ADVERTISED})
    assert decode_allocatable(payload) == ADVERTISED


def test_a_kubelet_before_1_23_says_what_it_lacks(server: PodResourcesServer, socket_path: str) -> None:
    server.set_behaviour("unimplemented", ALLOCATABLE_METHOD)
    with pytest.raises(PodResourcesError, match="GetAllocatableResources.*Kubernetes 1.23") as raised:
        list_allocatable(socket_path)
    assert raised.value.reason == "unimplemented"
    # List still answers: attribution goes on, counting held replicas.
    assert list_allocations(socket_path) == GPU_ONLY


def test_a_malformed_allocatable_answer_names_its_message() -> None:
    with pytest.raises(PodResourcesError, match="byte 1 of a AllocatableResourcesResponse") as raised:
        decode_allocatable(b"\x0a")
    assert raised.value.reason == "invalid"
    with pytest.raises(PodResourcesError, match="of a ContainerDevices"):
        decode_allocatable(b"\x0a\x02\x0a\x80")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_advertised_devices_are_read_once_per_ttl(server: PodResourcesServer, socket_path: str) -> None:
    clock = Clock()
    reader = AllocationReader(socket_path, clock=clock)
    for _ in range(3):
        read = reader.read()
        assert read.advertised == ADVERTISED_GPUS and read.advertised_error is None
    assert (server.requests, server.allocatable_requests) == (3, 1)
    clock.now += ADVERTISED_TTL
    reader.read()
    assert (server.requests, server.allocatable_requests) == (4, 2)


def test_an_id_the_plugin_did_not_advertise_reads_them_again_once(
    server: PodResourcesServer, socket_path: str
) -> None:
    reader = AllocationReader(socket_path, clock=Clock())
    reader.read()
    # The plugin was reconfigured and a new pod holds one of its new IDs: read again at once.
    renamed = Allocation("ml", "new", "main", "nvidia.com/gpu.shared", UUID + "::9")
    server.set_allocations(TRAINING + [renamed])
    server.set_advertised(ADVERTISED + [Advertised("nvidia.com/gpu.shared", UUID + "::9")])
    assert Advertised("nvidia.com/gpu.shared", UUID + "::9") in reader.read().advertised
    assert server.allocatable_requests == 2
    # An ID the plugin still does not advertise (say an unhealthy GPU a pod holds) asks no more.
    server.set_allocations(TRAINING + [renamed, Allocation("ml", "stuck", "main", "nvidia.com/gpu", "GPU-" + "7" * 8
                                                           + "-7777-7777-7777-777777777777")])
    for _ in range(3):
        reader.read()
    assert server.allocatable_requests == 3


def test_a_kubelet_without_allocatable_is_asked_again_only_after_the_ttl(
    server: PodResourcesServer, socket_path: str
) -> None:
    clock = Clock()
    reader = AllocationReader(socket_path, clock=clock)
    server.set_behaviour("unimplemented", ALLOCATABLE_METHOD)
    for _ in range(3):
        read = reader.read()
        assert read.source == "pod_resources" and read.items == GPU_ONLY
        assert read.advertised is None and "Kubernetes 1.23" in read.advertised_error
    assert server.allocatable_requests == 1
    server.set_behaviour("ok")
    clock.now += ADVERTISED_TTL
    assert reader.read().advertised == ADVERTISED_GPUS


def test_a_passing_failure_keeps_the_last_answer_and_retries_next_run(
    server: PodResourcesServer, socket_path: str
) -> None:
    clock = Clock()
    reader = AllocationReader(socket_path, clock=clock)
    reader.read()
    clock.now += ADVERTISED_TTL
    server.set_behaviour("rate_limited", ALLOCATABLE_METHOD)
    for _ in range(2):
        read = reader.read()
        assert read.advertised == ADVERTISED_GPUS and read.advertised_error is None
    assert server.allocatable_requests == 3
    server.set_behaviour("ok")
    reader.read()
    reader.read()
    assert server.allocatable_requests == 4


def test_a_passing_failure_with_no_answer_yet_is_said(server: PodResourcesServer, socket_path: str) -> None:
    reader = AllocationReader(socket_path, clock=Clock())
    server.set_behaviour("rate_limited", ALLOCATABLE_METHOD)
    read = reader.read()
    assert read.items == GPU_ONLY and read.advertised is None and "rate-limiting" in read.advertised_error
    server.set_behaviour("ok")
    assert reader.read().advertised == ADVERTISED_GPUS


def test_snapshots_carry_advertised_devices_and_read_older_ones() -> None:
    allocations = Allocations(source="pod_resources", items=GPU_ONLY, advertised=ADVERTISED_GPUS)
    snapshot = Snapshot(timestamp=1.0, node=Node(), allocations=allocations)
    assert Snapshot.from_json(snapshot.to_json()) == snapshot
    # A sidecar from before GetAllocatableResources sends neither field: the kubelet did not say.
    older = snapshot.to_dict()
    del older["allocations"]["advertised"], older["allocations"]["advertised_error"]
    read = Snapshot.from_dict(older).allocations
    assert read.items == GPU_ONLY and read.advertised is None and read.advertised_error is None


# --- An answer the kubelet repeats byte for byte is decoded once ------------------------------
# A reused answer hands out the very objects it decoded before, so identity tells a decode from a reuse.


def same_objects(first: List[object], second: List[object]) -> bool:
    return len(first) == len(second) and all(a is b for a, b in zip(first, second))


def test_an_unchanged_answer_is_decoded_once_but_asked_every_run(server: PodResourcesServer, socket_path: str) -> None:
    reader = AllocationReader(socket_path, clock=Clock())
    first, second = reader.read(), reader.read()
    assert first.items == second.items == GPU_ONLY
    assert same_objects(first.items, second.items)
    assert server.requests == 2


def test_a_caller_changing_its_list_does_not_change_the_next_answer(
    server: PodResourcesServer, socket_path: str
) -> None:
    reader = AllocationReader(socket_path, clock=Clock())
    first = reader.read()
    first.items.clear()
    assert reader.read().items == GPU_ONLY


def test_a_changed_answer_is_decoded_anew(server: PodResourcesServer, socket_path: str) -> None:
    reader = AllocationReader(socket_path, clock=Clock())
    first = reader.read().items
    server.set_allocations(TRAINING[:2])
    changed = reader.read().items
    assert changed == GPU_ONLY[:2]
    assert not any(a is b for a, b in zip(first, changed))
    # Only the last answer is kept: going back to the first one decodes it again.
    server.set_allocations(TRAINING)
    back = reader.read().items
    assert back == first and not any(a is b for a, b in zip(first, back))


def test_other_resource_patterns_filter_the_same_answer_anew(server: PodResourcesServer, socket_path: str) -> None:
    last: LastAnswer[Allocation] = LastAnswer()
    assert list_allocations(socket_path, last=last) == GPU_ONLY
    assert list_allocations(socket_path, ["*"], last=last) == TRAINING
    assert list_allocations(socket_path, last=last) == GPU_ONLY


def test_a_malformed_answer_after_a_good_one_is_invalid_every_time(
    server: PodResourcesServer, socket_path: str
) -> None:
    last: LastAnswer[Allocation] = LastAnswer()
    good = list_allocations(socket_path, last=last)
    server.set_behaviour("garbage")
    for _ in range(2):
        with pytest.raises(PodResourcesError, match="undecodable pod-resources response") as raised:
            list_allocations(socket_path, last=last)
        assert raised.value.reason == "invalid"
    # The garbage was never kept: the good answer, sent again, is still the one decoded before.
    server.set_behaviour("ok")
    assert same_objects(list_allocations(socket_path, last=last), good)


@pytest.mark.parametrize("behaviour, reason", [("rate_limited", "rate-limiting"), ("unimplemented", "feature gate")])
def test_a_failed_call_gives_its_error_not_the_last_answer(
    server: PodResourcesServer, socket_path: str, behaviour: str, reason: str
) -> None:
    reader = AllocationReader(socket_path, clock=Clock())
    assert reader.read().items == GPU_ONLY
    server.set_behaviour(behaviour)
    for _ in range(2):
        read = reader.read()
        assert read.source == "error" and read.items == [] and reason in read.error
    server.set_behaviour("ok")
    assert reader.read().items == GPU_ONLY


def test_a_stopped_kubelet_gives_its_error_not_the_last_answer(socket_path: str) -> None:
    reader = AllocationReader(socket_path, clock=Clock())
    with PodResourcesServer(socket_path, TRAINING):
        assert reader.read().items == GPU_ONLY
    read = reader.read()
    assert read.source == "error" and read.items == [] and "does not exist" in read.error


def test_an_unchanged_allocatable_answer_is_decoded_once(server: PodResourcesServer, socket_path: str) -> None:
    clock = Clock()
    reader = AllocationReader(socket_path, clock=clock)
    first = reader.read().advertised
    clock.now += ADVERTISED_TTL
    again = reader.read().advertised
    assert server.allocatable_requests == 2
    assert first == again == ADVERTISED_GPUS and same_objects(first, again)
