"""A service check's status, as every layer judges: sources say how a read went, health what it found."""

from enum import IntEnum


class Status(IntEnum):
    """A service check status, ranked from OK to CRITICAL (the worst of several is their max).

    The values are the Agent's own (datadog_checks.base.constants.ServiceCheck: OK 0, WARNING 1,
    CRITICAL 2), so a Status is sent as it is; the names are those messages and reports print."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
