"""gRPC channels to unix sockets, and the callables of their methods, kept from one call to the next.

Setting a channel up costs the check more CPU than a call over it (on a pod-resources List,
about 0.3 ms against 0.15 ms), and the check calls once a run. A channel is dropped after any
failed call, so a kubelet that restarted is reached afresh rather than through gRPC's reconnect
back-off, and when the socket file is no longer the one it was made for (a restarted kubelet
makes its socket anew).
"""

import os
import threading
from collections import OrderedDict
from typing import Any, Dict, List, NamedTuple, Tuple

# Far more sockets than a check talks to: only tests and odd configurations reach it.
MAX_CHANNELS = 8


class _Kept(NamedTuple):
    identity: Tuple[int, int, int]
    channel: Any
    # Making a method's callable costs a few microseconds of the check's CPU each time; it lives as
    # long as its channel.
    methods: Dict[str, Any]


_lock = threading.Lock()
_channels: "OrderedDict[str, _Kept]" = OrderedDict()


def unary_unary(grpc: Any, socket_path: str, options: List[Tuple[str, Any]], method: str) -> Any:
    """A callable for unary `method` that sends and returns bytes as they are, over the channel to
    `socket_path`, both made now or kept from before; raises OSError (FileNotFoundError among them)
    when the socket cannot be looked at."""
    kept = _kept(grpc, socket_path, options)
    call = kept.methods.get(method)
    if call is None:
        # Two threads may both make one here: either callable serves.
        call = kept.methods[method] = kept.channel.unary_unary(
            method, request_serializer=None, response_deserializer=None
        )
    return call


def _kept(grpc: Any, socket_path: str, options: List[Tuple[str, Any]]) -> _Kept:
    status = os.stat(socket_path)
    # A new socket file may get the inode number the old one freed: its change time tells them apart.
    identity = (status.st_dev, status.st_ino, status.st_ctime_ns)
    with _lock:
        kept = _channels.get(socket_path)
        if kept is not None and kept.identity == identity:
            return kept
        made = _Kept(identity, grpc.insecure_channel("unix://" + os.path.abspath(socket_path), options=options), {})
        _channels[socket_path] = made
        stale = [kept.channel] if kept is not None else []
        while len(_channels) > MAX_CHANNELS:
            stale.append(_channels.popitem(last=False)[1].channel)
    for old in stale:
        old.close()
    return made


def discard(socket_path: str) -> None:
    """Forget the channel to `socket_path` after a failed call: the next call makes a new one."""
    with _lock:
        kept = _channels.pop(socket_path, None)
    if kept is not None:
        kept.channel.close()
