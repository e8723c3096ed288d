"""dcgm-exporter's `/metrics`, read safely: one deadline for the whole exchange, a size bound, no
redirect followed, and one connection kept alive from run to run (http_get.bounded_get)."""

import requests
import urllib3

from ..bounded import MIB, Deadline, ReadLimitExceeded
from ..http_get import bounded_get, http_wrapper, reason_of
from ..service_checks import Status

# The exporter renders its page from samples DCGM already holds: it answers in milliseconds, and a
# run must not wait on it long. Few seconds leave the run's other reads their time.
DEFAULT_TIMEOUT = 3.0
# An 8-GPU node with every GPU in seven MIG instances and all of DCGM's fields is under 2 MiB.
MAX_BODY_BYTES = 16 * MIB


class DcgmError(Exception):
    """The exporter could not be read; `status` is the service check status it deserves."""

    def __init__(self, status: Status, message: str):
        super().__init__(message)
        self.status = status


class DcgmClient:
    """Reads one exporter's page; `requests` counts the requests sent."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT):
        self.url = url
        self.timeout = timeout
        self.requests = 0
        # Plain HTTP in practice; an https URL is verified against the system's CAs.
        self._http = http_wrapper()

    def read(self) -> bytes:
        self.requests += 1
        try:
            status, body = bounded_get(self._http, self.url, Deadline(self.timeout), MAX_BODY_BYTES)
        except ReadLimitExceeded as e:
            if e.reason == "too_large":
                raise DcgmError(Status.CRITICAL, f"{self.url} sent too much: {e}") from None
            # It answers, if late: values may come next run.
            raise DcgmError(Status.WARNING, f"{self.url} did not answer in time: {e}; it may be overloaded") from None
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as e:
            raise DcgmError(Status.CRITICAL, f"cannot connect to {self.url}: {reason_of(e)}") from None
        if 300 <= status < 400:
            raise DcgmError(Status.CRITICAL, f"{self.url} answered with a redirect (HTTP {status}), which is refused: "
                                             "dcgm_exporter_url must name the exporter's own /metrics")
        if status != 200:
            raise DcgmError(Status.CRITICAL, f"{self.url} answered HTTP {status}")
        return body

    def close(self) -> None:
        self._http.session.close()
