"""The node's own series and its health service check: GPUs on the PCI bus and expected, held
verdicts, escalated GPUs, each InfiniBand/RoCE port's series, and `node.health`."""

from typing import Callable, List

from datadog_checks.base import AgentCheck

from gpu_monitoring.health.judge import NodeReport
from gpu_monitoring.metrics.names import NODE_GPUS_ESCALATED, NODE_GPUS_EXPECTED, NODE_GPUS_PCI, NODE_VERDICTS_HELD

NODE_HEALTH_CHECK = "node.health"


def submit_node(check: AgentCheck, send: Callable[[str, float, List[str]], None], report: NodeReport,
                tags: List[str]) -> None:
    """`send` submits one series if the metrics profile sends it."""
    verdict = report.verdict
    if verdict.gpus_on_bus is not None:
        send(NODE_GPUS_PCI, verdict.gpus_on_bus, tags)
    if report.expected_gpus is not None:
        send(NODE_GPUS_EXPECTED, report.expected_gpus, tags)
    send(NODE_VERDICTS_HELD, report.held, tags)
    send(NODE_GPUS_ESCALATED, report.escalated, tags)
    for port_tags, values in verdict.ports:
        series_tags = tags + port_tags
        for name, value in values.items():
            send(name, value, series_tags)
    check.service_check(NODE_HEALTH_CHECK, verdict.health.status, tags=tags, message=verdict.health.message or None)
