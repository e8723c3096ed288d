"""The check's side of the sidecar API: HTTP over the unix socket, snapshot and events."""

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any, Dict, List, Optional
from urllib.parse import urlencode

from ..snapshot import Event, Snapshot
from . import protocol


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


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class SidecarClient:
    def __init__(self, socket_path: str = protocol.DEFAULT_SOCKET, timeout: float = 10.0):
        self.socket_path = socket_path
        self.timeout = timeout

    def snapshot(self) -> Snapshot:
        body = self.get(protocol.SNAPSHOT_PATH)
        try:
            return Snapshot.from_dict(body["snapshot"])
        except (KeyError, TypeError, ValueError) as e:
            raise SidecarUnavailable(
                f"sidecar at {self.socket_path} sent a snapshot this check cannot read: {e!r}"
            ) from e

    def events(self, after: int, limit: int = protocol.DEFAULT_EVENTS_LIMIT) -> EventsPage:
        body = self.get(f"{protocol.EVENTS_PATH}?{urlencode({'after': after, 'limit': limit})}")
        try:
            records = body["events"]
            events = [Event(**{k: v for k, v in r.items() if k != "seq"}) for r in records]
            last = records[-1]["seq"] if records else after
            return EventsPage(events, last, int(body["last_seq"]), bool(body["lost"]))
        except (KeyError, TypeError, ValueError) as e:
            raise SidecarUnavailable(f"sidecar at {self.socket_path} sent events this check cannot read: {e!r}") from e

    def get(self, path: str) -> Dict[str, Any]:
        connection = _UnixConnection(self.socket_path, self.timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            raw = response.read()
        except FileNotFoundError as e:
            raise SidecarUnavailable(f"no sidecar socket at {self.socket_path}: is the sidecar running on this node "
                                     "and its socket directory mounted into the Agent?") from e
        except (OSError, http.client.HTTPException) as e:
            raise SidecarUnavailable(f"cannot talk to the sidecar at {self.socket_path}: {e!r}") from e
        finally:
            connection.close()
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise SidecarUnavailable(f"sidecar at {self.socket_path} answered {path} with something not JSON") from e
        if response.status != 200:
            message = body.get("error") if isinstance(body, dict) else None
            raise SidecarUnavailable(f"sidecar at {self.socket_path} answered {path} with HTTP {response.status}: "
                                     f"{message or raw[:200]!r}", status=response.status)
        if not isinstance(body, dict) or body.get("api_version") != protocol.API_VERSION:
            raise SidecarUnavailable(f"sidecar at {self.socket_path} speaks API version "
                                     f"{body.get('api_version') if isinstance(body, dict) else '?'}, "
                                     f"this check {protocol.API_VERSION}: upgrade the older of the two")
        return body
