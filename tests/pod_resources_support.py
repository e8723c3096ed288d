"""What the pod-resources tests share: the kubelet's raw List answer, and what any cut of it must give."""

import grpc

from gpu_monitoring.kube.pod_resources import LIST_METHOD, PodResourcesError, decode_allocations


def raw_list(socket_path: str) -> bytes:
    """The List answer's bytes, as the server put them on the wire."""
    with grpc.insecure_channel("unix://" + socket_path) as channel:
        return channel.unary_unary(LIST_METHOD)(b"", timeout=5)


def assert_every_truncation_is_rejected_or_a_whole_pod_prefix(payload: bytes) -> None:
    """A cut answer is refused as invalid, or (cut between pods) gives the whole answer's first pods."""
    full = decode_allocations(payload)
    for size in range(len(payload)):
        try:
            decoded = decode_allocations(payload[:size])
        except PodResourcesError as error:
            assert error.reason == "invalid"
        else:
            assert decoded == full[: len(decoded)]
