"""A service check that says why, and logs each change of reason once: sources and health send them alike."""

from typing import TYPE_CHECKING, List, Optional, Tuple

from gpu_monitoring.status import Status

# The sidecar, which has no Agent, imports this package too: the Agent's base is for type hints only.
if TYPE_CHECKING:
    from datadog_checks.base import AgentCheck


class ReasonedServiceCheck:
    """One service check, sent every run with the reason for its status as its message (none while OK).

    The log tells each change once, not every run: a new reason at WARNING level (`problem`, or
    `critical` for a CRITICAL status where that line differs), and `cleared` at INFO when the
    reason goes away."""

    def __init__(self, check: "AgentCheck", name: str, tags: List[str], problem: str, cleared: str,
                 critical: Optional[str] = None):
        self._check = check
        self._name = name
        self._tags = tags
        self._problem = problem
        self._critical = critical or problem
        self._cleared = cleared
        self._told: Tuple[Status, Optional[str]] = (Status.OK, None)

    def send(self, status: Status, reason: Optional[str] = None) -> None:
        if (status, reason) != self._told:
            self._log(status, reason)
            self._told = (status, reason)
        # An OK service check carries no message: the Agent drops it (and its test stub refuses it).
        self._check.service_check(self._name, status, tags=self._tags,
                                  message=reason if status is not Status.OK else None)

    def _log(self, status: Status, reason: Optional[str]) -> None:
        if reason and status is Status.OK:
            self._check.log.info(self._problem, reason)
        elif reason:
            self._check.log.warning(self._critical if status is Status.CRITICAL else self._problem, reason)
        elif self._told[1]:
            self._check.log.info(self._cleared)
