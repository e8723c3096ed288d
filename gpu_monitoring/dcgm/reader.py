"""One run's DCGM read: the exporter to read (configured or found), its page, what of it is fresh,
and what it gives the snapshot, with the state of the `dcgm.can_connect` service check.

`dcgm_exporter_url` is `none` (never read), a URL, or `auto`: the exporter found in the kubelet's
pod list, the last one found while the kubelet cannot be read, none off Kubernetes. No read ever
fails the run: every fault is a service check status and its reason.

CRITICAL: the exporter refuses the connection, answers an HTTP error or a redirect, sends too much
or no dcgm-exporter page, or its GPUs are none of this node's (a URL of another node's exporter).
WARNING: it answers late (past the deadline), its values are stale, or it sends no profiling field
(DCGM_FI_PROF_*: the GPUs or its counters CSV give none). A slow answer within the deadline is OK.
"""

import logging
from typing import List, Optional, Tuple

from gpu_monitoring.dcgm.client import DEFAULT_TIMEOUT, DcgmClient, DcgmError
from gpu_monitoring.dcgm.discovery import exporter_url
from gpu_monitoring.dcgm.exposition import Known, NotAnExporterPage, parse
from gpu_monitoring.dcgm.freshness import Freshness
from gpu_monitoring.dcgm.join import join, wanted
from gpu_monitoring.kube.pod_list import PodInfo
from gpu_monitoring.snapshot import Snapshot
from gpu_monitoring.status import Status

log = logging.getLogger(__name__)

AUTO = "auto"
NONE = "none"
State = Tuple[Status, Optional[str]]


class DcgmReader:
    def __init__(self, setting: str, timeout: float = DEFAULT_TIMEOUT):
        self._setting = setting
        self._timeout = timeout
        self._found: Optional[str] = None
        self.client: Optional[DcgmClient] = None
        self.freshness = Freshness()
        self._known: Known = {}  # the exporter's series parsed so far (exposition.parse)

    def enrich(self, snapshot: Snapshot, pods: Optional[List[PodInfo]]) -> Optional[State]:
        """Put the exporter's values into the snapshot; the service check's state, or None where no
        exporter is configured or found (no service check is sent then)."""
        url = self._url(pods)
        if url is None:
            return None
        client = self._client(url)
        try:
            return self._read(client, snapshot)
        except DcgmError as e:
            return e.status, str(e)
        except Exception as e:  # a library's surprise must fail this read, not the run
            log.debug("reading dcgm-exporter at %s failed", url, exc_info=True)
            return Status.CRITICAL, f"reading {url} failed unexpectedly: {type(e).__name__}: {e}"

    def _url(self, pods: Optional[List[PodInfo]]) -> Optional[str]:
        if self._setting == NONE:
            return None
        if self._setting != AUTO:
            return self._setting
        if pods is not None:
            self._found = exporter_url(pods)
        return self._found

    def _client(self, url: str) -> DcgmClient:
        """The client of `url`, kept while the URL stays: one connection, one exporter's history."""
        if self.client is None or self.client.url != url:
            if self.client is not None:
                self.client.close()
            self.client = DcgmClient(url, self._timeout)
            self.freshness = Freshness()
            self._known = {}
        return self.client

    def close(self) -> None:
        """Let the kept-alive connection go (the check is cancelled)."""
        if self.client is not None:
            self.client.close()

    def _read(self, client: DcgmClient, snapshot: Snapshot) -> State:
        try:
            page = parse(client.read(), wanted(snapshot), self._known)
        except NotAnExporterPage as e:
            return Status.CRITICAL, f"{client.url} is no dcgm-exporter page: {e}"
        if not page.samples:
            return Status.WARNING, (f"{client.url} sends no DCGM_FI_PROF_* field: enable them in its counters "
                                    "CSV (these GPUs may not support DCGM's profiling)")
        samples, stale = self.freshness.fresh(page)
        if stale:
            return Status.WARNING, f"{client.url}: {stale}"
        if not join(snapshot, samples):
            return Status.CRITICAL, (f"{client.url} reports none of this node's GPUs (no UUID matches): "
                                     "dcgm_exporter_url must name this node's exporter")
        return Status.OK, None
