"""gRPC channels to unix sockets, kept from one call to the next.

Setting a channel up costs the check more CPU than a call over it (on a pod-resources List,
about 0.3 ms against 0.15 ms), and the check calls once a run. A channel is dropped after any
failed call, so a kubelet that restarted is reached afresh rather than through gRPC's reconnect
back-off, and when the socket file is no longer the one it was made for (a restarted kubelet
makes its socket anew).
"""

import os
import threading
from collections import OrderedDict
from typing import Any, List, Tuple

# Far more sockets than a check talks to: only tests and odd configurations reach it.
MAX_CHANNELS = 8

_lock = threading.Lock()
_channels: "OrderedDict[str, Tuple[Tuple[int, int, int], Any]]" = OrderedDict()


def channel(grpc: Any, socket_path: str, options: List[Tuple[str, Any]]) -> Any:
    """The channel to `socket_path`, made now or kept from before; raises OSError (FileNotFoundError
    among them) when the socket cannot be looked at."""
    status = os.stat(socket_path)
    # A new socket file may get the inode number the old one freed: its change time tells them apart.
    identity = (status.st_dev, status.st_ino, status.st_ctime_ns)
    with _lock:
        kept = _channels.get(socket_path)
        if kept is not None and kept[0] == identity:
            return kept[1]
        made = grpc.insecure_channel("unix://" + os.path.abspath(socket_path), options=options)
        _channels[socket_path] = (identity, made)
        stale = [kept[1]] if kept is not None else []
        while len(_channels) > MAX_CHANNELS:
            stale.append(_channels.popitem(last=False)[1][1])
    for old in stale:
        old.close()
    return made


def discard(socket_path: str) -> None:
    """Forget the channel to `socket_path` after a failed call: the next call makes a new one."""
    with _lock:
        kept = _channels.pop(socket_path, None)
    if kept is not None:
        kept[1].close()
