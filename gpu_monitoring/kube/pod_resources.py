"""Which pod and container holds each GPU, and which devices the device plugins advertise, from
the kubelet's PodResources API (v1: List, and GetAllocatableResources from kubelet 1.23).

List names a container's devices from device plugins (`devices`) and, from Kubernetes 1.27, from
DRA claims (`dynamic_resources`); only claims of NVIDIA's GPU driver are kept.

The Agent ships protobuf 3.x through 7.x, and generated code only runs on the major it was
generated for, so the response is decoded here straight from the protobuf wire format. Only the
fields attribution needs are read; every other field, known to newer kubelets or not, is skipped.
grpcio is imported on the first call: the Agent does not ship it, and only local mode calls.
"""

import dataclasses
import logging
import os
import re
import socket
from types import ModuleType
from typing import Callable, Generic, Iterable, Iterator, List, Optional, Tuple, TypeVar

from gpu_monitoring.deps import MissingPackage, require
from gpu_monitoring.kube import grpc_channels
from gpu_monitoring.kube.cdi_devices import GPU_DRIVER, UnmappedName, device_of
from gpu_monitoring.kube.device_ids import DEFAULT_RESOURCES, matches_resource
from gpu_monitoring.net.bounded_read import Deadline, describe_size
from gpu_monitoring.snapshot import Advertised, Allocation

log = logging.getLogger(__name__)

LIST_METHOD = "/v1.PodResourcesLister/List"
ALLOCATABLE_METHOD = "/v1.PodResourcesLister/GetAllocatableResources"

# The kubelet's own client accepts 16 MiB; gRPC's 4 MiB default is too small for a node with many pods.
# gRPC enforces it as the answer arrives, and the call's timeout is a deadline for the whole call.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_OPTIONS = [("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)]
# gRPC reports an answer over the limit with the status the kubelet's rate limiter uses too
# (RESOURCE_EXHAUSTED): only its details tell them apart.
_TOO_LARGE = re.compile(r"larger than max", re.IGNORECASE)

# The kubelet release that serves each method and the feature gate that can turn it off.
_SINCE = {LIST_METHOD: "1.20", ALLOCATABLE_METHOD: "1.23"}
_GATES = {LIST_METHOD: "KubeletPodResources", ALLOCATABLE_METHOD: "KubeletPodResourcesGetAllocatable"}

# Both have the resource_name that the resource patterns filter on.
T = TypeVar("T", Allocation, Advertised)

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
_FIXED_WIDTH = {_FIXED64: 8, _FIXED32: 4}
_MAX_VARINT_BYTES = 10


class PodResourcesError(Exception):
    """A pod-resources call failed. `reason` is one of missing, permission, no_grpc, unimplemented, rate_limited,
    too_large, timeout, unavailable, invalid, error; the message says what happened and what to do about it."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class LastAnswer(Generic[T]):
    """One method's last good answer and the devices it listed, kept by a caller that asks every run.

    While no pod comes or goes the kubelet answers the same bytes run after run, and decoding them
    costs the check about as much CPU as the call itself; an equal answer reuses what the last one
    listed. Only answers that decoded are kept, so a bad answer is reported as bad every time. The
    devices, frozen dataclasses, are shared from run to run."""

    def __init__(self) -> None:
        self._last: Optional[Tuple[bytes, Tuple[str, ...], List[T]]] = None

    def devices(self, payload: bytes, patterns: Tuple[str, ...], decode: Callable[[bytes], List[T]]) -> List[T]:
        """The devices of a resource matching `patterns` in `payload`, decoded now or reused; raises
        PodResourcesError with reason `invalid` when the payload is not the message `decode` reads."""
        last = self._last
        if last is None or last[0] != payload or last[1] != patterns:
            devices = [d for d in decode(payload) if _wanted(d, patterns)]
            # One assignment, so that a reader in another thread never sees the bytes of one answer
            # with the devices of another.
            self._last = last = (payload, patterns, devices)
        # A new list each time: a caller may add to or sort what it was given.
        return list(last[2])


def _wanted(device: T, patterns: Tuple[str, ...]) -> bool:
    """A DRA claim is kept whatever the patterns: they name device plugins' resources, and the decoder
    keeps only NVIDIA's GPU driver's claims."""
    return (isinstance(device, Allocation) and device.dynamic) or matches_resource(device.resource_name, patterns)


def list_allocations(
    socket_path: str,
    resource_patterns: Iterable[str] = DEFAULT_RESOURCES,
    timeout: float = 5.0,
    last: Optional[LastAnswer[Allocation]] = None,
) -> List[Allocation]:
    """Every device of a resource matching one of the globs, as the kubelet's socket lists them now.

    Pass the same `last` on every call to skip decoding an answer equal to the one before."""
    return _fetch(socket_path, LIST_METHOD, decode_allocations, resource_patterns, timeout, last)


def list_allocatable(
    socket_path: str,
    resource_patterns: Iterable[str] = DEFAULT_RESOURCES,
    timeout: float = 5.0,
    last: Optional[LastAnswer[Advertised]] = None,
) -> List[Advertised]:
    """Every device ID the device plugins advertise for a resource matching one of the globs, held or
    free. A kubelet before 1.23 (or with the feature off) raises reason `unimplemented`. `last` is as
    for list_allocations."""
    return _fetch(socket_path, ALLOCATABLE_METHOD, decode_allocatable, resource_patterns, timeout, last)


def _fetch(
    socket_path: str,
    method: str,
    decode: Callable[[bytes], List[T]],
    resource_patterns: Iterable[str],
    timeout: float,
    last: Optional[LastAnswer[T]],
) -> List[T]:
    patterns = tuple(resource_patterns)
    payload = _call(_grpc(), socket_path, method, timeout)
    try:
        return (last if last is not None else LastAnswer()).devices(payload, patterns, decode)
    except PodResourcesError as error:
        raise PodResourcesError(
            f"kubelet pod-resources API at {socket_path} sent an {error}: is something other than the kubelet "
            "listening on that socket?",
            error.reason,
        ) from error


def _grpc() -> ModuleType:
    try:
        return require("grpc")
    except MissingPackage as e:
        raise PodResourcesError(str(e), "no_grpc") from None


def _call(grpc: ModuleType, socket_path: str, method: str, timeout: float) -> bytes:
    try:
        Deadline(timeout)
    except ValueError as e:
        message = f"the kubelet pod-resources API is not asked: its timeout is wrong ({e})"
        raise PodResourcesError(message, "error") from None
    # No serializers: the empty request is b"" and the answer is decoded after the call, so a
    # bad answer is reported as such rather than as gRPC's generic deserialization failure.
    try:
        call = grpc_channels.unary_unary(grpc, socket_path, _OPTIONS, method)
    except PermissionError:  # the kubelet's pod-resources directory is 0750 root's
        raise _permission_denied(socket_path) from None
    except OSError:
        raise PodResourcesError(
            f"kubelet pod-resources socket {socket_path} does not exist: mount the host directory "
            "/var/lib/kubelet/pod-resources into this container (read-only is enough), "
            "or set pod_resources_socket to where the kubelet serves it",
            "missing",
        ) from None
    try:
        return call(b"", timeout=timeout)
    except grpc.RpcError as error:
        grpc_channels.discard(socket_path)
        raise _rpc_failure(grpc, error, socket_path, method, timeout) from error


def _rpc_failure(
    grpc: ModuleType, error: Exception, socket_path: str, method: str, timeout: float
) -> PodResourcesError:
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (error.details() if isinstance(error, grpc.Call) else None) or str(error)
    where = f"kubelet pod-resources API at {socket_path}"
    name = method.rsplit(".", 1)[-1]  # PodResourcesLister/<method>
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return PodResourcesError(
            f"{where} does not serve v1 {name} ({details}): it needs Kubernetes {_SINCE[method]} or "
            f"newer with the {_GATES[method]} feature gate on (the default)",
            "unimplemented",
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _TOO_LARGE.search(details):
        return PodResourcesError(
            f"{where} sent a {name} answer larger than {describe_size(MAX_RESPONSE_BYTES)}, the most this check "
            f"reads ({details}): is something other than the kubelet listening on that socket?",
            "too_large",
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return PodResourcesError(
            f"{where} is rate-limiting calls ({details}): another client on the node calls it too often; "
            "the next check run tries again",
            "rate_limited",
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PodResourcesError(
            f"{where} did not answer within {timeout:g}s: the kubelet may be overloaded; "
            "the next check run tries again",
            "timeout",
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        if _connect_refused_for_permission(socket_path):
            return _permission_denied(socket_path)
        return PodResourcesError(
            f"cannot reach the {where} ({details}): check that the kubelet is running", "unavailable"
        )
    call = method.rsplit("/", 1)[-1]
    return PodResourcesError(f"{where} failed the {call} call with {code.name}: {details}", "error")


def _connect_refused_for_permission(socket_path: str) -> bool:
    """Whether connecting fails with EACCES or EPERM. gRPC reports it as UNAVAILABLE, like a kubelet that is
    down, in words that vary by release; a plain connect says which it is."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(socket_path)
    except PermissionError:  # EACCES and EPERM both
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


def _permission_denied(socket_path: str) -> PodResourcesError:
    # kubelet (pkg/kubelet/kubelet.go setupDataDirs): pod-resources/ is made 0750 and its socket by the
    # kubelet, both root's; connect(2) on a unix socket needs write permission on the socket file.
    return PodResourcesError(
        f"permission denied on the kubelet pod-resources socket {socket_path} for uid {os.geteuid()}: the kubelet "
        "makes the socket and its directory root's, and connecting to a unix socket needs write permission on it; "
        "run as uid 0 (the gpu-monitoring-sidecar chart's default podSecurityContext: runAsUser 0 with every "
        "capability dropped)",
        "permission",
    )


def decode_allocations(payload: bytes) -> List[Allocation]:
    """Decode a serialized ListPodResourcesResponse into one allocation per device ID.

    Truncated or malformed bytes raise PodResourcesError with reason `invalid`."""
    allocations: List[Allocation] = []
    for number, pod in _length_delimited_fields(payload, "ListPodResourcesResponse"):
        if number == 1:
            allocations.extend(_decode_pod(pod))
    return allocations


def _decode_pod(payload: bytes) -> Iterator[Allocation]:
    name = namespace = ""
    containers = []
    for number, value in _length_delimited_fields(payload, "PodResources"):
        if number == 1:
            name = _text(value, "PodResources.name")
        elif number == 2:
            namespace = _text(value, "PodResources.namespace")
        elif number == 3:
            containers.append(value)
    # Fields may arrive in any order, so the pod's names are only known once it is read whole.
    for container in containers:
        yield from _decode_container(container, namespace, name)


def _decode_container(payload: bytes, namespace: str, pod: str) -> Iterator[Allocation]:
    name = ""
    devices, claims = [], []
    for number, value in _length_delimited_fields(payload, "ContainerResources"):
        if number == 1:
            name = _text(value, "ContainerResources.name")
        elif number == 2:
            devices.append(_decode_devices(value))
        elif number == 5:  # dynamic_resources, from Kubernetes 1.27
            claims.append(value)
    for resource_name, device_ids in devices:
        for device_id in device_ids:
            yield Allocation(namespace, pod, name, resource_name, device_id)
    for claim in claims:
        yield from _decode_claim(claim, Allocation(namespace, pod, name, GPU_DRIVER, ""))


# kubelet pkg/apis/podresources/v1/api.proto. Kubernetes 1.27-1.30:
#   DynamicResource{class_name=1, claim_name=2, claim_namespace=3, claim_resources=4}, ClaimResource{cdi_devices=1}
# Kubernetes 1.31+ (class_name gone; a ClaimResource per device):
#   DynamicResource{claim_name=2, claim_namespace=3, claim_resources=4},
#   ClaimResource{cdi_devices=1, driver_name=2, pool_name=3, device_name=4, share_id=5 (1.34, optional)}
# and in both CDIDevice{name=1}.
_CLAIM_RESOURCE_FIELDS = {2: "driver_name", 3: "pool_name", 4: "device_name", 5: "share_id"}


def _decode_claim(payload: bytes, container: Allocation) -> List[Allocation]:
    """The devices of NVIDIA's GPU driver that one claim gives `container` (a template holding its names)."""
    claim_name = claim_namespace = ""
    resources = []
    for number, value in _length_delimited_fields(payload, "DynamicResource"):
        if number == 2:
            claim_name = _text(value, "DynamicResource.claim_name")
        elif number == 3:
            claim_namespace = _text(value, "DynamicResource.claim_namespace")
        elif number == 4:
            resources.append(value)
    # A pod can only refer to claims in its own namespace (resource.k8s.io ResourceClaim).
    claimed = dataclasses.replace(container, claim_name=claim_name,
                                  claim_namespace=claim_namespace or container.namespace)
    found: List[Allocation] = []
    for resource in resources:
        for allocation in _decode_claim_resource(resource, claimed):
            # Before 1.31 one driver release names each device twice (device=... and claim=...).
            if allocation.resource_name == GPU_DRIVER and allocation not in found:
                found.append(allocation)
    return found


def _decode_claim_resource(payload: bytes, claim: Allocation) -> List[Allocation]:
    cdi_names, fields = [], {}
    for number, value in _length_delimited_fields(payload, "ClaimResource"):
        if number == 1:
            cdi_names.append(_cdi_name(value))
        elif number in _CLAIM_RESOURCE_FIELDS:
            fields[number] = _text(value, f"ClaimResource.{_CLAIM_RESOURCE_FIELDS[number]}")
    if 2 in fields:  # Kubernetes 1.31+: the driver names its device
        return [dataclasses.replace(claim, resource_name=fields[2], device_id=fields.get(4, ""),
                                    pool=fields.get(3) or None, share_id=fields.get(5))]
    return [dataclasses.replace(claim, resource_name=driver, device_id=device)
            for driver, device in _cdi_devices(cdi_names, claim)]


def _cdi_name(payload: bytes) -> str:
    name = ""
    for number, value in _length_delimited_fields(payload, "CDIDevice"):
        if number == 1:
            name = _text(value, "CDIDevice.name")
    return name


def _cdi_devices(cdi_names: List[str], claim: Allocation) -> Iterator[Tuple[str, str]]:
    for cdi_name in cdi_names:
        try:
            device = device_of(cdi_name)
        except UnmappedName as e:
            # Decoded once per changed answer (LastAnswer), so said once per change.
            log.warning("pod-resources: claim %s/%s of %s/%s container %s is not attributed: %s",
                        claim.claim_namespace, claim.claim_name, claim.namespace, claim.pod, claim.container, e)
            continue
        if device is not None:
            yield device


def decode_allocatable(payload: bytes) -> List[Advertised]:
    """Decode a serialized AllocatableResourcesResponse into one entry per advertised device ID.

    Its CPU IDs and memory are no GPU's and are skipped; malformed bytes raise reason `invalid`."""
    advertised: List[Advertised] = []
    for number, devices in _length_delimited_fields(payload, "AllocatableResourcesResponse"):
        if number == 1:
            resource_name, device_ids = _decode_devices(devices)
            advertised.extend(Advertised(resource_name, device_id) for device_id in device_ids)
    return advertised


def _decode_devices(payload: bytes) -> Tuple[str, List[str]]:
    resource_name = ""
    device_ids = []
    for number, value in _length_delimited_fields(payload, "ContainerDevices"):
        if number == 1:
            resource_name = _text(value, "ContainerDevices.resource_name")
        elif number == 2:
            device_ids.append(_text(value, "ContainerDevices.device_ids"))
    return resource_name, device_ids


def _length_delimited_fields(payload: bytes, message: str) -> Iterator[Tuple[int, bytes]]:
    """Yield (field number, bytes) of each length-delimited field, skipping fields of other wire types.

    Every field read here is a string or a message, and protobuf parsers treat a known field number
    with an unexpected wire type as an unknown field, so skipping those is what the runtime does too."""
    position, end = 0, len(payload)
    while position < end:
        start = position
        key, position = _varint(payload, position, message)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise _invalid(message, start, "field number 0")
        if wire_type == _VARINT:
            _, position = _varint(payload, position, message)
            continue
        if wire_type == _LENGTH_DELIMITED:
            size, position = _varint(payload, position, message)
        elif wire_type in _FIXED_WIDTH:
            size = _FIXED_WIDTH[wire_type]
        else:
            raise _invalid(message, start, f"unsupported wire type {wire_type} in field {number}")
        if position + size > end:
            raise _invalid(message, start, f"field {number} runs past the end of the message")
        if wire_type == _LENGTH_DELIMITED:
            yield number, payload[position : position + size]
        position += size


def _varint(payload: bytes, position: int, message: str) -> Tuple[int, int]:
    value = 0
    for index in range(_MAX_VARINT_BYTES):
        if position + index >= len(payload):
            raise _invalid(message, position, "truncated varint")
        byte = payload[position + index]
        value |= (byte & 0x7F) << (7 * index)
        if byte < 0x80:
            return value, position + index + 1
    raise _invalid(message, position, f"varint longer than {_MAX_VARINT_BYTES} bytes")


def _text(value: bytes, field: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PodResourcesError(f"undecodable pod-resources response: {field} is not UTF-8", "invalid") from error


def _invalid(message: str, position: int, problem: str) -> PodResourcesError:
    return PodResourcesError(
        f"undecodable pod-resources response: {problem} at byte {position} of a {message}", "invalid"
    )
