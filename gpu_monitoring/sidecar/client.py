"""The check's side of the sidecar API: HTTP over the unix socket, snapshot and events.

Each request, from connecting to the answer's last byte, ends within the client's timeout and
reads at most MAX_RESPONSE_BYTES (http_get.bounded_get); what the answer holds is checked where it
is read.
"""

import http.client
import json
from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, List, Optional
from urllib.parse import urlencode

from gpu_monitoring.net.bounded_read import MIB, Deadline, ReadLimitExceeded
from gpu_monitoring.net.deadline_connection import UnixConnection
from gpu_monitoring.net.http_get import Answer, ConnectionPeer, bounded_get
from gpu_monitoring.sidecar import protocol
from gpu_monitoring.snapshot import Event, Snapshot, json_typed, load

# A snapshot of an 8-GPU node with its processes is tens of KiB, a page of 1,000 events a few
# hundred: a hundred times the most a real node sends.
MAX_RESPONSE_BYTES = 16 * MIB


class SidecarUnavailable(Exception):
    """The sidecar could not be reached or did not answer as it should; the message says how.
    `status` is the HTTP status it answered with, if it answered."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.status = status


@dataclass
class EventsPage:
    events: List[Event]
    last_seq: int  # the newest sequence number in the page, or the cursor when it is empty
    journal_last_seq: int
    lost: bool


class SidecarClient:
    def __init__(self, socket_path: str = protocol.DEFAULT_SOCKET, timeout: float = 10.0):
        self.socket_path = socket_path
        self.timeout = timeout

    def snapshot(self) -> Snapshot:
        body = self.get(protocol.SNAPSHOT_PATH)
        try:
            return Snapshot.from_dict(body.get("snapshot"))
        except ValueError as e:
            message = f"sidecar at {self.socket_path} sent a snapshot this check cannot read: {e}"
            raise SidecarUnavailable(message) from e

    def events(self, after: int, limit: int = protocol.DEFAULT_EVENTS_LIMIT) -> EventsPage:
        body = self.get(f"{protocol.EVENTS_PATH}?{urlencode({'after': after, 'limit': limit})}")
        try:
            return _events_page(body, after)
        except ValueError as e:
            raise SidecarUnavailable(f"sidecar at {self.socket_path} sent events this check cannot read: {e}") from e

    def get(self, path: str) -> Dict[str, Any]:
        answer = self._answer(path)
        try:
            body = json.loads(answer.body)
        except (ValueError, RecursionError) as e:  # RecursionError: arrays nested past Python's stack
            raise SidecarUnavailable(f"sidecar at {self.socket_path} answered {path} with something not JSON") from e
        if answer.status != 200:
            message = body.get("error") if isinstance(body, dict) else None
            raise SidecarUnavailable(f"sidecar at {self.socket_path} answered {path} with HTTP {answer.status}: "
                                     f"{message or answer.body[:200]!r}", status=answer.status)
        if not isinstance(body, dict) or body.get("api_version") != protocol.API_VERSION:
            raise SidecarUnavailable(f"sidecar at {self.socket_path} speaks API version "
                                     f"{body.get('api_version') if isinstance(body, dict) else '?'}, "
                                     f"this check {protocol.API_VERSION}: upgrade the older of the two")
        return body

    def _answer(self, path: str) -> Answer:
        """The answer to GET `path`, on a connection of its own (the sidecar closes each after answering)."""
        try:
            deadline = Deadline(self.timeout)
        except ValueError as e:
            raise SidecarUnavailable(f"the sidecar is not asked: its client's timeout is wrong ({e})") from None
        peer = ConnectionPeer(partial(UnixConnection, self.socket_path))
        try:
            return bounded_get(peer, path, deadline, MAX_RESPONSE_BYTES)
        except FileNotFoundError as e:
            raise SidecarUnavailable(f"no sidecar socket at {self.socket_path}: is the sidecar running on this node "
                                     "and its socket directory mounted into the Agent?") from e
        except ReadLimitExceeded as e:
            raise SidecarUnavailable(f"sidecar at {self.socket_path} answered {path} wrongly: {e}") from None
        except http.client.IncompleteRead as e:
            # A sidecar that died mid-answer, not one that sent something wrong.
            declared = "" if e.expected is None else f" of the {len(e.partial) + e.expected}"
            raise SidecarUnavailable(f"sidecar at {self.socket_path} closed the connection after {len(e.partial)}"
                                     f"{declared} bytes of its answer to {path}: did it stop or crash?") from None
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise SidecarUnavailable(f"cannot talk to the sidecar at {self.socket_path}: {e!r}") from e
        finally:
            peer.discard()


def _events_page(body: Dict[str, Any], after: int) -> EventsPage:
    """The page an events answer describes; ValueError naming the first wrong field."""
    records = json_typed(list, body.get("events"), "events")
    events, last = [], after
    for i, record in enumerate(records):
        last = json_typed(int, json_typed(dict, record, f"events[{i}]").get("seq"), f"events[{i}].seq")
        events.append(load(Event, record, f"events[{i}]"))
    return EventsPage(
        events, last, json_typed(int, body.get("last_seq"), "last_seq"), json_typed(bool, body.get("lost"), "lost")
    )

