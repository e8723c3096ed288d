"""A kubelet PodResources API (v1, List and GetAllocatableResources) served over a real gRPC unix socket.

Responses are encoded by the official protobuf runtime from message classes built at start-up
from a descriptor assembled here, so the check's hand-written decoder meets the bytes a real
kubelet would send. Works with protobuf 4.21 through 7.x.

An allocation with a claim name is a DRA claim's device (its resource name the driver's); it is
served in the messages of the Kubernetes release the server plays: from 1.31 with the driver, pool
and device names, from 1.27 to 1.30 as CDI device names alone, written as NVIDIA's drivers write them.
"""

import contextlib
import os
import threading
import uuid
from concurrent import futures
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from gpu_monitoring.kube.pod_resources import ALLOCATABLE_METHOD, LIST_METHOD
from gpu_monitoring.snapshot import Advertised, Allocation

BEHAVIOURS = ("ok", "unimplemented", "rate_limited", "slow", "garbage")
# How NVIDIA's DRA drivers name a claim's devices in CDI (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/cdi.go):
# claim: `<vendor>/claim=<claim UID>-<device>` (current releases); standard: `<vendor>/device=<device>` before
# it (2024-09 to 2025-07); classic: `<vendor>/claim=common` and `<vendor>/claim=<claim UID>` (releases for
# Kubernetes 1.26-1.30). The vendor is `k8s.` + the driver's name.
CDI_NAMINGS = ("claim", "standard", "classic")

_FIELD = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "v1"
_SERVICE, _LIST = LIST_METHOD.strip("/").split("/")
_ALLOCATABLE = ALLOCATABLE_METHOD.rsplit("/", 1)[-1]

# Field types are protobuf scalar type numbers or the name of another message in the package.
_SCHEMA: Dict[str, Tuple[Tuple[str, int, Union[int, str], bool], ...]] = {
    "ListPodResourcesResponse": (("pod_resources", 1, "PodResources", True),),
    "PodResources": (
        ("name", 1, _FIELD.TYPE_STRING, False),
        ("namespace", 2, _FIELD.TYPE_STRING, False),
        ("containers", 3, "ContainerResources", True),
    ),
    "ContainerResources": (
        ("name", 1, _FIELD.TYPE_STRING, False),
        ("devices", 2, "ContainerDevices", True),
        ("dynamic_resources", 5, "DynamicResource", True),
    ),
    "ContainerDevices": (
        ("resource_name", 1, _FIELD.TYPE_STRING, False),
        ("device_ids", 2, _FIELD.TYPE_STRING, True),
        ("topology", 3, "TopologyInfo", False),
    ),
    "AllocatableResourcesResponse": (
        ("devices", 1, "ContainerDevices", True),
        ("cpu_ids", 2, _FIELD.TYPE_INT64, True),
        ("memory", 3, "ContainerMemory", True),
    ),
    "ContainerMemory": (
        ("memory_type", 1, _FIELD.TYPE_STRING, False),
        ("size", 2, _FIELD.TYPE_UINT64, False),
        ("topology", 3, "TopologyInfo", False),
    ),
    "TopologyInfo": (("nodes", 1, "NUMANode", True),),
    "NUMANode": (("ID", 1, _FIELD.TYPE_INT64, False),),
    "CDIDevice": (("name", 1, _FIELD.TYPE_STRING, False),),
}
_CLAIM_FIELDS = (
    ("claim_name", 2, _FIELD.TYPE_STRING, False),
    ("claim_namespace", 3, _FIELD.TYPE_STRING, False),
    ("claim_resources", 4, "ClaimResource", True),
)
# The DRA messages of each layout, by the first Kubernetes release that sends it (kubelet
# pkg/apis/podresources/v1/api.proto). share_id (1.34) is `optional` there: the same bytes whenever it is set.
_DRA_SCHEMAS = {
    (1, 31): {
        "DynamicResource": _CLAIM_FIELDS,
        "ClaimResource": (
            ("cdi_devices", 1, "CDIDevice", True),
            ("driver_name", 2, _FIELD.TYPE_STRING, False),
            ("pool_name", 3, _FIELD.TYPE_STRING, False),
            ("device_name", 4, _FIELD.TYPE_STRING, False),
            ("share_id", 5, _FIELD.TYPE_STRING, False),
        ),
    },
    (1, 27): {
        "DynamicResource": (("class_name", 1, _FIELD.TYPE_STRING, False), *_CLAIM_FIELDS),
        "ClaimResource": (("cdi_devices", 1, "CDIDevice", True),),
    },
}

# With extra_fields, each message the check reads also carries fields no kubelet defines yet, one per
# wire type, to stand for whatever a newer API version adds.
_EXTRA_FIELDS = (
    ("extra_varint", 1000, _FIELD.TYPE_INT64, False),
    ("extra_fixed64", 1001, _FIELD.TYPE_FIXED64, False),
    ("extra_fixed32", 1002, _FIELD.TYPE_FIXED32, False),
    ("extra_text", 1003, _FIELD.TYPE_STRING, False),
)
_EXTENDED = (
    "ListPodResourcesResponse", "PodResources", "ContainerResources", "ContainerDevices",
    "AllocatableResourcesResponse", "DynamicResource", "ClaimResource",
)
# -1 makes the longest varint there is (10 bytes).
_EXTRA_VALUES = {"extra_varint": -1, "extra_fixed64": 2**64 - 1, "extra_fixed32": 7, "extra_text": "newer kubelet"}

_GARBAGE = b"\xff" * 16
_RATE_LIMIT_MESSAGE = "rejected by rate limit"
# A node's CPUs and memory ride along in every allocatable answer; the check skips them.
_CPU_IDS = (0, 1, 2, 3, 130)
_MEMORY_BYTES = 64 * 2**30


class PodResourcesServer:
    """Serves `allocations` (Allocation-like: namespace, pod, container, resource_name,
    device_id) from List and `advertised` (resource_name, device_id) from GetAllocatableResources
    on `unix://<socket_path>` until stopped.

    `behaviour` is one of BEHAVIOURS, for both methods or (set_behaviour) one: ok; unimplemented
    (a kubelet before 1.20, or for GetAllocatableResources alone one from 1.20 to 1.22);
    rate_limited (the kubelet's RESOURCE_EXHAUSTED); slow (answers after `delay` seconds);
    garbage (bytes that are no protobuf message). `requests` and
    `allocatable_requests` count the calls of each method received.

    `kubernetes_version` ("1.27" or later) picks the DRA messages List sends, and `cdi_naming` (one of
    CDI_NAMINGS) how the CDI device names in them are written."""

    def __init__(
        self,
        socket_path: str,
        allocations: Iterable[Allocation] = (),
        advertised: Iterable[Advertised] = (),
        behaviour: str = "ok",
        delay: float = 1.0,
        extra_fields: bool = False,
        kubernetes_version: str = "1.34",
        cdi_naming: str = "claim",
    ) -> None:
        if cdi_naming not in CDI_NAMINGS:
            raise ValueError(f"unknown CDI naming {cdi_naming!r}; expected one of {', '.join(CDI_NAMINGS)}")
        self.socket_path = socket_path
        self.delay = delay
        self._layout = _dra_layout(kubernetes_version)
        self._cdi_naming = cdi_naming
        self._classes = _message_classes(extra_fields, self._layout)
        self._extra_fields = extra_fields
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._requests = {_LIST: 0, _ALLOCATABLE: 0}
        self._behaviours = {_LIST: behaviour, _ALLOCATABLE: behaviour}
        self._server: Optional[grpc.Server] = None
        self._executor: Optional[futures.ThreadPoolExecutor] = None
        self.set_behaviour(behaviour)
        self.set_allocations(allocations)
        self.set_advertised(advertised)

    @property
    def requests(self) -> int:
        with self._lock:
            return self._requests[_LIST]

    @property
    def allocatable_requests(self) -> int:
        with self._lock:
            return self._requests[_ALLOCATABLE]

    def set_allocations(self, allocations: Iterable[Allocation]) -> None:
        payload = self._encode(list(allocations))
        with self._lock:
            self._payload = payload

    def set_advertised(self, advertised: Iterable[Advertised]) -> None:
        payload = self._encode_advertised(list(advertised))
        with self._lock:
            self._advertised_payload = payload

    def set_behaviour(self, behaviour: str, method: Optional[str] = None) -> None:
        """How both methods answer, or only `method` (LIST_METHOD or ALLOCATABLE_METHOD)."""
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown pod-resources behaviour {behaviour!r}; expected one of {', '.join(BEHAVIOURS)}")
        with self._lock:
            for name in self._behaviours:
                if method is None or method.endswith("/" + name):
                    self._behaviours[name] = behaviour

    def start(self) -> "PodResourcesServer":
        if self._server is not None:
            raise RuntimeError(f"pod-resources server on {self.socket_path} is already running")
        os.makedirs(os.path.dirname(os.path.abspath(self.socket_path)), exist_ok=True)
        self._stopping.clear()
        self._executor = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="pod-resources")
        handler = grpc.method_handlers_generic_handler(_SERVICE, {
            _LIST: grpc.unary_unary_rpc_method_handler(self._list),
            _ALLOCATABLE: grpc.unary_unary_rpc_method_handler(self._allocatable),
        })
        self._server = grpc.server(self._executor, handlers=(handler,))
        if not self._server.add_insecure_port("unix:" + self.socket_path):
            self.stop()
            raise OSError(f"cannot bind the pod-resources server to {self.socket_path}")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        # Wakes a slow answer first so that stopping never waits out its delay.
        self._stopping.set()
        self._server.stop(grace=None).wait()
        self._executor.shutdown(wait=True)
        self._server = self._executor = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def __enter__(self) -> "PodResourcesServer":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            payload = self._payload
        return self._answer(_LIST, payload, context)

    def _allocatable(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            payload = self._advertised_payload
        return self._answer(_ALLOCATABLE, payload, context)

    def _answer(self, method: str, payload: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self._requests[method] += 1
            behaviour = self._behaviours[method]
        if behaviour == "unimplemented":
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"unknown method {method} for service {_SERVICE}")
        if behaviour == "rate_limited":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _RATE_LIMIT_MESSAGE)
        if behaviour == "slow":
            self._stopping.wait(self.delay)
        return _GARBAGE if behaviour == "garbage" else payload

    def _encode_advertised(self, advertised: List[Advertised]) -> bytes:
        response = self._classes["AllocatableResourcesResponse"](cpu_ids=_CPU_IDS)
        self._stamp(response)
        response.memory.add(memory_type="memory", size=_MEMORY_BYTES).topology.nodes.add(ID=0)
        by_resource: Dict[str, List[str]] = {}
        for device in advertised:
            by_resource.setdefault(device.resource_name, []).append(device.device_id)
        for resource_name, device_ids in by_resource.items():
            devices = response.devices.add(resource_name=resource_name, device_ids=device_ids)
            devices.topology.nodes.add(ID=0)
            self._stamp(devices)
        return response.SerializeToString()

    def _encode(self, allocations: List[Allocation]) -> bytes:
        response = self._classes["ListPodResourcesResponse"]()
        self._stamp(response)
        for (namespace, pod_name), containers in _group(allocations).items():
            pod = response.pod_resources.add(name=pod_name, namespace=namespace)
            self._stamp(pod)
            for container_name, held in containers.items():
                container = pod.containers.add(name=container_name)
                self._stamp(container)
                self._encode_devices(container, [a for a in held if not a.dynamic])
                claims = _by([a for a in held if a.dynamic], lambda a: (a.claim_namespace, a.claim_name))
                for claim in claims.values():
                    self._encode_claim(container.dynamic_resources.add(), claim)
        return response.SerializeToString()

    def _encode_devices(self, container: Any, allocations: List[Allocation]) -> None:
        for resource_name, held in _by(allocations, lambda a: a.resource_name).items():
            devices = container.devices.add(resource_name=resource_name, device_ids=[a.device_id for a in held])
            # The NVIDIA device plugin reports each GPU's NUMA node; the check does not read it.
            devices.topology.nodes.add(ID=0)
            self._stamp(devices)

    def _encode_claim(self, claim: Any, devices: List[Allocation]) -> None:
        first = devices[0]
        claim.claim_name, claim.claim_namespace = first.claim_name, first.claim_namespace
        self._stamp(claim)
        if self._layout >= (1, 31):  # a ClaimResource per device, named by its driver
            for device in devices:
                resource = claim.claim_resources.add(driver_name=device.resource_name, pool_name=device.pool or "",
                                                     device_name=device.device_id)
                if device.share_id is not None:
                    resource.share_id = device.share_id
                self._add_cdi_names(resource, [device])
            return
        # Before 1.31: a ClaimResource per driver, its CDI device names alone (the class named for the driver).
        claim.class_name = first.resource_name
        for held in _by(devices, lambda a: a.resource_name).values():
            self._add_cdi_names(claim.claim_resources.add(), held)

    def _add_cdi_names(self, resource: Any, devices: List[Allocation]) -> None:
        self._stamp(resource)  # each ClaimResource passes here once
        names = [name for device in devices for name in _cdi_names(device, self._cdi_naming)]
        for name in dict.fromkeys(names):  # the classic driver's names are the claim's, not each device's
            resource.cdi_devices.add(name=name)

    def _stamp(self, message: Any) -> None:
        if self._extra_fields:
            for name, value in _EXTRA_VALUES.items():
                setattr(message, name, value)


def _group(allocations: List[Allocation]) -> Dict[Tuple[str, str], Dict[str, List[Allocation]]]:
    """Nest flat allocations as the kubelet does: pod, then container, in first-seen order."""
    pods: Dict[Tuple[str, str], Dict[str, List[Allocation]]] = {}
    for allocation in allocations:
        containers = pods.setdefault((allocation.namespace, allocation.pod), {})
        containers.setdefault(allocation.container, []).append(allocation)
    return pods


def _by(allocations: List[Allocation], key: Callable[[Allocation], Any]) -> Dict[Any, List[Allocation]]:
    """Allocations grouped by `key`, in first-seen order."""
    groups: Dict[Any, List[Allocation]] = {}
    for allocation in allocations:
        groups.setdefault(key(allocation), []).append(allocation)
    return groups


def _cdi_names(device: Allocation, naming: str) -> List[str]:
    kind = f"k8s.{device.resource_name}"
    claim_uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"resourceclaim/{device.claim_namespace}/{device.claim_name}"))
    if naming == "classic":
        return [f"{kind}/claim=common", f"{kind}/claim={claim_uid}"]
    claimed = f"{kind}/claim={claim_uid}-{device.device_id}"
    return [f"{kind}/device={device.device_id}", claimed] if naming == "standard" else [claimed]


def _dra_layout(kubernetes_version: str) -> Tuple[int, int]:
    try:
        release = tuple(int(part) for part in kubernetes_version.split(".")[:2])
    except ValueError:
        release = ()
    layout = next((since for since in sorted(_DRA_SCHEMAS, reverse=True) if release >= since), None)
    if len(release) != 2 or layout is None:
        raise ValueError(f"Kubernetes version {kubernetes_version!r}: expected <major>.<minor>, 1.27 or later "
                         "(the first to list DRA claims in pod-resources)")
    return layout


def _message_classes(extra_fields: bool, layout: Tuple[int, int] = (1, 31)) -> Dict[str, Any]:
    # A private pool keeps these names clear of any v1 pod-resources types the process registered itself.
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(_file_descriptor(extra_fields, layout).SerializeToString())
    get_message_class = getattr(message_factory, "GetMessageClass", None)
    # protobuf before 4.22 has no GetMessageClass.
    make = get_message_class or message_factory.MessageFactory(pool).GetPrototype
    return {
        name: make(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in ("ListPodResourcesResponse", "AllocatableResourcesResponse")
    }


def _file_descriptor(extra_fields: bool, layout: Tuple[int, int]) -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="gpu_monitoring_sim/pod_resources.proto", package=_PACKAGE)
    file.syntax = "proto3"
    for message_name, fields in {**_SCHEMA, **_DRA_SCHEMAS[layout]}.items():
        message = file.message_type.add(name=message_name)
        extra = _EXTRA_FIELDS if extra_fields and message_name in _EXTENDED else ()
        for name, number, kind, repeated in fields + extra:
            field = message.field.add(name=name, number=number)
            field.label = _FIELD.LABEL_REPEATED if repeated else _FIELD.LABEL_OPTIONAL
            if isinstance(kind, str):
                field.type = _FIELD.TYPE_MESSAGE
                field.type_name = f".{_PACKAGE}.{kind}"
            else:
                field.type = kind
    return file
