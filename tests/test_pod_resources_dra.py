"""DRA claims in pod-resources (`ContainerResources.dynamic_resources`) against a real gRPC server.

The server encodes with the official protobuf runtime the messages of the Kubernetes release it plays:
from 1.31 the driver names each device; from 1.27 to 1.30 only CDI device names say which it is.
"""

import dataclasses
import json
import logging
import re
import ssl
import urllib.request
from typing import Iterator, List

import pytest

from gpu_monitoring.kube.allocations import AllocationReader
from gpu_monitoring.kube.cdi_devices import UnmappedName, device_of
from gpu_monitoring.kube.pod_list import parse_pod_list
from gpu_monitoring.kube.pod_resources import (
    Allocation,
    PodResourcesError,
    decode_allocations,
    list_allocatable,
    list_allocations,
)
from gpu_monitoring.simulator.node import simulated_node
from gpu_monitoring.simulator.pod_resources_server import PodResourcesServer

from .pod_resources_support import assert_every_truncation_is_rejected_or_a_whole_pod_prefix, raw_list

GPU = "GPU-5d5f9d2a-3c1b-4f5e-9a7b-2c8d0e1f2a3b"
POOL = "gpu-node-7"
SHARE = "6f1e1c52-2b7a-4c1e-9d0b-3f5a7e9c1d24"
CLAIM_UID = "dab5ab50-d59a-42a6-af16-cfd4628c0f7a"


def claim(pod: str, container: str, device: str, name: str, driver: str = "gpu.nvidia.com", **extra) -> Allocation:
    return Allocation("ml", pod, container, driver, device, claim_name=name, claim_namespace="ml", pool=POOL, **extra)


PLUGIN = Allocation("ml", "trainer-0", "main", "nvidia.com/gpu", GPU)
TRAINER = [claim("trainer-0", "main", "gpu-0", "trainer-0-gpus"), claim("trainer-0", "main", "gpu-1", "trainer-0-gpus")]
OTHER_DRIVER = claim("trainer-0", "main", "channel-0", "trainer-0-domain", driver="compute-domain.nvidia.com")
MIG = claim("notebook", "jupyter", "gpu-3-mig-1g10gb-19-6", "notebook-mig")
SHARED = [claim("embed", "server", "gpu-4", "shared-gpu"), claim("rerank", "server", "gpu-4", "shared-gpu")]
SHARE_OF = claim("notebook", "jupyter", "gpu-5", "notebook-share", share_id=SHARE)
# Served in this order; a container's device-plugin devices come before its claims, as the decoder yields them.
SERVED = [PLUGIN, *TRAINER, OTHER_DRIVER, MIG, SHARE_OF, *SHARED]
GPU_CLAIMS = [*TRAINER, MIG, SHARE_OF, *SHARED]


def before_1_31(allocation: Allocation) -> Allocation:
    """What a kubelet before 1.31 tells of a claim: neither its pool nor a share."""
    return dataclasses.replace(allocation, pool=None, share_id=None) if allocation.dynamic else allocation


@pytest.fixture
def socket_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("dra") / "kubelet.sock")


def test_claims_of_nvidias_gpu_driver_are_allocations_from_kubernetes_1_31(socket_path: str) -> None:
    with PodResourcesServer(socket_path, SERVED, kubernetes_version="1.34"):
        found = list_allocations(socket_path)
        payload = raw_list(socket_path)
    assert found == [PLUGIN, *GPU_CLAIMS]
    assert all(a.dynamic for a in found[1:]) and not PLUGIN.dynamic
    assert found[found.index(SHARE_OF)].share_id == SHARE
    # The other driver's claim really was on the wire, beside each device's CDI name.
    assert b"compute-domain.nvidia.com" in payload and b"k8s.gpu.nvidia.com/claim=" in payload


@pytest.mark.parametrize("version", ["1.27", "1.30"])
@pytest.mark.parametrize("naming", ["claim", "standard"])
def test_before_1_31_the_cdi_names_say_the_device(socket_path: str, version: str, naming: str) -> None:
    with PodResourcesServer(socket_path, SERVED, kubernetes_version=version, cdi_naming=naming):
        found = list_allocations(socket_path)
        payload = raw_list(socket_path)
    assert found == [before_1_31(a) for a in [PLUGIN, *GPU_CLAIMS]]
    assert b"driver_name" not in payload and POOL.encode() not in payload
    assert (b"k8s.gpu.nvidia.com/device=gpu-0" in payload) == (naming == "standard")


def test_other_drivers_claims_are_dropped_in_both_layouts(socket_path: str) -> None:
    for version in ("1.30", "1.34"):
        with PodResourcesServer(socket_path, [OTHER_DRIVER], kubernetes_version=version):
            assert list_allocations(socket_path, ["*"]) == []


def test_claims_are_kept_whatever_the_resource_patterns(socket_path: str) -> None:
    with PodResourcesServer(socket_path, SERVED):
        assert list_allocations(socket_path, ["example.com/*"]) == GPU_CLAIMS
        assert AllocationReader(socket_path).read().items == [PLUGIN, *GPU_CLAIMS]


def test_fields_a_newer_kubelet_adds_to_claims_are_skipped(socket_path: str) -> None:
    with PodResourcesServer(socket_path, SERVED, extra_fields=True):
        payload = raw_list(socket_path)
    claims = {(a.namespace, a.pod, a.container, a.claim_name) for a in SERVED if a.dynamic}
    devices = sum(1 for a in SERVED if a.dynamic)
    assert payload.count(b"newer kubelet") == 1 + 4 + 4 + 1 + len(claims) + devices
    assert decode_allocations(payload) == [PLUGIN, *GPU_CLAIMS]


LEGACY = claim("legacy", "main", "gpu-6", "legacy-gpu", driver="gpu.resource.nvidia.com")


@pytest.fixture
def classic(socket_path: str) -> Iterator[PodResourcesServer]:
    """A 1.30 kubelet with NVIDIA's classic DRA driver, whose CDI names say the claim only."""
    with PodResourcesServer(socket_path, [PLUGIN, LEGACY], kubernetes_version="1.30", cdi_naming="classic") as server:
        yield server


def warnings(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_cdi_name_that_says_no_device_warns_once_per_change(
    classic: PodResourcesServer, socket_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    reader = AllocationReader(socket_path)
    for _ in range(3):
        assert reader.read().items == [PLUGIN]
    said = warnings(caplog)
    # The classic driver's common edits (`claim=common`) are no device and no warning.
    assert len(said) == 1 and "ml/legacy-gpu of ml/legacy container main is not attributed" in said[0]
    assert re.search(r"'k8s\.gpu\.resource\.nvidia\.com/claim=[0-9a-f-]{36}' of NVIDIA's DRA driver names no GPU",
                     said[0])
    # Another pod comes: the answer changed, and the claim is still not attributed.
    classic.set_allocations([PLUGIN, LEGACY, Allocation("ml", "new", "main", "nvidia.com/gpu", GPU)])
    reader.read()
    assert len(warnings(caplog)) == 2


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def _in_container(dynamic_resource: bytes) -> bytes:
    return _field(1, _field(1, b"p") + _field(2, b"ns") + _field(3, _field(1, b"c") + _field(5, dynamic_resource)))


@pytest.mark.parametrize(
    "dynamic_resource, problem",
    [
        (b"\x12\x80", "truncated varint at byte 1 of a DynamicResource"),
        (b"\x12\x05ab", "field 2 runs past the end of the message at byte 0 of a DynamicResource"),
        (_field(2, b"\xff"), "DynamicResource.claim_name is not UTF-8"),
        (_field(4, b"\x12\x09gpu"), "field 2 runs past the end of the message at byte 0 of a ClaimResource"),
        (_field(4, _field(2, b"gpu.nvidia.com") + _field(5, b"\xc3")), "ClaimResource.share_id is not UTF-8"),
        (_field(4, _field(1, b"\x0a\x80")), "truncated varint at byte 1 of a CDIDevice"),
        (_field(4, _field(1, _field(1, b"\xff"))), "CDIDevice.name is not UTF-8"),
    ],
)
def test_a_damaged_claim_is_rejected_clearly(dynamic_resource: bytes, problem: str) -> None:
    with pytest.raises(PodResourcesError, match=re.escape(problem)) as raised:
        decode_allocations(_in_container(dynamic_resource))
    assert raised.value.reason == "invalid"


def test_every_truncation_of_an_answer_with_claims_is_rejected_or_a_whole_pod_prefix(socket_path: str) -> None:
    with PodResourcesServer(socket_path, SERVED):
        payload = raw_list(socket_path)
    assert_every_truncation_is_rejected_or_a_whole_pod_prefix(payload)


def test_a_claim_without_namespace_is_in_its_pods() -> None:
    resource = _field(2, b"gpu.nvidia.com") + _field(4, b"gpu-2")
    assert decode_allocations(_in_container(_field(2, b"mine") + _field(4, resource))) == [
        Allocation("ns", "p", "c", "gpu.nvidia.com", "gpu-2", claim_name="mine", claim_namespace="ns")
    ]


@pytest.mark.parametrize(
    "name, device",
    [
        (f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0", ("gpu.nvidia.com", "gpu-0")),
        (f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-3-mig-1g10gb-19-6", ("gpu.nvidia.com", "gpu-3-mig-1g10gb-19-6")),
        (f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-2-mig-9-4-4", ("gpu.nvidia.com", "gpu-2-mig-9-4-4")),
        ("k8s.gpu.nvidia.com/device=gpu-7", ("gpu.nvidia.com", "gpu-7")),
        ("k8s.gpu.resource.nvidia.com/claim=common", None),
        (f"k8s.compute-domain.nvidia.com/claim={CLAIM_UID}-channel-0", None),
        ("nvidia.com/gpu=0", None),
    ],
)
def test_cdi_names_of_nvidias_drivers_map_to_their_device(name: str, device: object) -> None:
    assert device_of(name) == device


@pytest.mark.parametrize(
    "name",
    [f"k8s.gpu.resource.nvidia.com/claim={CLAIM_UID}", f"k8s.gpu.nvidia.com/claim={CLAIM_UID}",
     "k8s.gpu.nvidia.com/claim=gpu-0", "gpu-0", ""],
)
def test_a_cdi_name_naming_no_device_says_so(name: str) -> None:
    with pytest.raises(UnmappedName, match=re.escape(repr(name))):
        device_of(name)


def test_the_server_refuses_a_release_without_claims_and_an_unknown_naming(socket_path: str) -> None:
    with pytest.raises(ValueError, match="1.27 or later"):
        PodResourcesServer(socket_path, kubernetes_version="1.26")
    with pytest.raises(ValueError, match="expected <major>.<minor>"):
        PodResourcesServer(socket_path, kubernetes_version="latest")
    with pytest.raises(ValueError, match="expected one of claim, standard, classic"):
        PodResourcesServer(socket_path, cdi_naming="uuid")


def test_the_dra_scenario_serves_its_claims_and_no_device_plugin() -> None:
    node = simulated_node("dra-h100")
    options = node.start()
    try:
        found = list_allocations(options["pod_resources_socket"])
        assert list_allocatable(options["pod_resources_socket"]) == []
        pods = parse_pod_list(_get_pods(options))
    finally:
        node.stop()
    assert found == node.allocations()
    held = {}
    for a in found:
        held.setdefault(a.pod, []).append(a.device_id)
    assert held == {
        "llm-pretrain-0": ["gpu-0", "gpu-1"],
        "vllm-llama-8b-7c9d5f6b4-m2xkq": ["gpu-2"],
        "jupyter-alice": ["gpu-3-mig-1g10gb-19-6"],
        "rag-embed-6d9c7b8f5-p4n2w": ["gpu-4"],
        "rag-rerank-5f8b9d7c6-k7t3v": ["gpu-4"],
        "jupyter-carol": ["gpu-5"],
        "finetune-mistral-7b-0-zq5pl": ["gpu-7"],
        "nvidia-dcgm-exporter-dra-8jx4c": [f"gpu-{n}" for n in range(8)],
    }
    assert {a.share_id for a in found if a.pod == "jupyter-carol"} == {"3c9e2f1a-7b4d-4e8a-9f0c-5d6b7a8e9f10"}
    assert {a.pool for a in found} == {"hgx-h100-dra-0"}
    monitor = next(p for p in pods if p.name == "nvidia-dcgm-exporter-dra-8jx4c")
    assert monitor.controller_kind == "DaemonSet" and monitor.labels == {"app": "nvidia-dcgm-exporter-dra"}


def _get_pods(options: dict) -> dict:
    context = ssl.create_default_context(cafile=options["kubelet_ca_path"])
    with open(options["kubelet_token_path"]) as token:
        request = urllib.request.Request(options["kubelet_url"] + "/pods",
                                         headers={"Authorization": f"Bearer {token.read().strip()}"})
    with urllib.request.urlopen(request, context=context, timeout=5) as answer:
        return json.loads(answer.read())
