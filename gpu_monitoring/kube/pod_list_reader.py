"""Successive `/pods` answers turned into pod lists, each pod read again only when its text changed.

A 110-pod node answers about 1.5 MB, of which a refresh seldom changes more than a pod or two;
decoding all of it and building every pod's record again is what a refresh would cost otherwise
(over 25 ms of CPU; reading it this way, well under 1 ms). The price is the last answer's pod
texts, kept to compare with (as large as the answer).

Whole answers are seldom the same bytes even when no pod changed: the kubelet lists its pods in
the order of a Go map, which differs on every walk (kubelet pkg/kubelet/pod/pod_manager.go,
`GetPods` -> `podsMapToPods`).

So the answer is cut into its pods' texts where one pod ends and the next begins (`},` and the
opening of the first pod up to its first key's value), and a pod whose text is one a previous
answer had is the record built from it then. The cut is checked, not trusted: each new piece must
decode on its own as one JSON value, and the answer with its items left out must be an object whose
`items` is the empty list. When both hold, the whole answer decodes to exactly those items in that
place; when either fails (another layout, a separator inside a pod, bytes that are no JSON) the
whole answer is decoded and read as usual, so a cut can cost time, never a wrong pod.
"""

import re
from typing import Dict, List, Optional, Tuple, Union

from gpu_monitoring.kube.pod_list import PodInfo, pod_list_items, read_pod

# orjson where it is installed, as the Agent's base decodes JSON
# (datadog_checks.base.utils.format._json); the standard library's otherwise. Both raise ValueError.
try:
    from orjson import loads as decode
except ImportError:
    from json import loads as decode

# `"items": [` as a key of some object; the kubelet's PodList writes it once, last.
_ITEMS = re.compile(rb'[{,]\s*"items"\s*:\s*\[')
# An object's opening up to its first value: `{"metadata":` as Go writes it.
_FIRST_KEY = re.compile(rb'\s*\{\s*"(?:[^"\\]|\\.)*"\s*:\s*')
# The items' closing bracket and the answer's closing brace, which the last bytes hold.
_END = re.compile(rb"\]\s*\}\s*\Z")
_END_BYTES = 64
# The start of a pod's text tells it from the others (Go writes its name first); the rest is compared.
_KEY_BYTES = 96

Read = Union[PodInfo, str]  # a pod, or why it is skipped


class PodListReader:
    """`read(body)`: the pods of a `/pods` answer and the reasons for those skipped, reusing the
    records of pods whose text the last answer had."""

    def __init__(self) -> None:
        self._known: Dict[bytes, Tuple[bytes, PodInfo]] = {}

    def read(self, body: bytes) -> Tuple[List[PodInfo], List[str]]:
        """ValueError when the answer is not JSON or not a pod list (RecursionError too deeply nested)."""
        reads = self._read_cut(body)
        if reads is None:
            reads = [read_pod(item, i) for i, item in enumerate(pod_list_items(decode(body)))]
        return [r for r in reads if isinstance(r, PodInfo)], [r for r in reads if isinstance(r, str)]

    def _read_cut(self, body: bytes) -> Optional[List[Read]]:
        cut = _cut(body)
        if cut is None:
            return None
        opening, pieces = cut
        known: Dict[bytes, Tuple[bytes, PodInfo]] = {}
        reads = []
        for i, piece in enumerate(pieces):
            read = self._reuse(piece) or _read_piece(opening + piece + b"}", i)
            if read is None:
                return None
            if isinstance(read, PodInfo):
                known[piece[:_KEY_BYTES]] = (piece, read)
            reads.append(read)
        self._known = known
        return reads

    def _reuse(self, piece: bytes) -> Optional[PodInfo]:
        text, pod = self._known.get(piece[:_KEY_BYTES], (None, None))
        return pod if text == piece else None


def _read_piece(text: bytes, index: int) -> Optional[Read]:
    """The pod one piece holds, or None when the piece is no JSON value on its own (a wrong cut)."""
    try:
        item = decode(text)
    except (ValueError, RecursionError):
        return None
    return read_pod(item, index)


def _cut(body: bytes) -> Optional[Tuple[bytes, List[bytes]]]:
    """The items' common opening and each item's text after it (less its closing brace), or None
    when the answer is not laid out so or its frame is not a pod list's. The body is 1.5 MB on a
    full node: it is searched by index and copied once, into the pieces."""
    found, end = _ITEMS.search(body), _END.search(body, max(len(body) - _END_BYTES, 0))
    if found is None or end is None or not _is_empty_pod_list(body[: found.end()] + body[end.start():]):
        return None
    opening = _FIRST_KEY.match(body, found.end(), end.start())
    if opening is None:
        return None if body[found.end(): end.start()].strip() else (b"", [])
    stop = end.start() - 1  # the last item's closing brace
    if body[stop:stop + 1] != b"}":
        return None
    head, first = opening.group().lstrip(), opening.end()
    # Go's encoding/json writes no space between items; Python's json.dumps (the simulator) one.
    separator = next((s for s in (b"}," + head, b"}, " + head) if body.find(s, first, stop) >= 0), None)
    if separator is None:
        return head, [body[first:stop]]
    if body.find(separator, 0, first) >= 0:
        return None
    # Cut the body itself, then trim the first and last pieces: no copy of the whole is made.
    pieces = body.split(separator)
    pieces[0] = pieces[0][first:]
    pieces[-1] = pieces[-1][: len(pieces[-1]) - (len(body) - stop)]
    return head, pieces


def _is_empty_pod_list(frame: bytes) -> bool:
    try:
        return pod_list_items(decode(frame)) == []
    except (ValueError, RecursionError):
        return False
