"""Series into the Agent's aggregator as `AgentCheck.gauge`, `monotonic_count` and `count` hand them
over, with what is the same from one series and one run to the next worked out once.

For each series `AgentCheck` prefixes the namespace, matches the name against `metric_patterns`,
normalizes the tag list, asks the metric limiter, converts the value and calls the aggregator.
The first three are functions of the name or the tag list and of options fixed when the check is
made, and a run sends about a hundred series under each GPU's one tag list, the same names every
run: here they are asked of the base class once per name or tag list, and its answers kept. The
limiter, the conversion and the aggregator are asked for every series, as the base class asks.
Whatever this path does not cover (a limited `count`, a value that is not a number) goes through
the base class's own method, so that it behaves exactly as there.
"""

from typing import AbstractSet, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from datadog_checks.base import AgentCheck
from datadog_checks.base.agent import aggregator
from datadog_checks.base.checks.base import ONE_PER_CONTEXT_METRIC_TYPES

from gpu_monitoring.metrics.spec import SPEC

# The aggregator's types of the spec's.
_TYPES = {"gauge": aggregator.GAUGE, "monotonic_count": aggregator.MONOTONIC_COUNT, "count": aggregator.COUNT}
# What the base class's limiter counts once a call (a gauge, a rate, a monotonic count); a count by its context.
_LIMITED_PER_CALL = frozenset(ONE_PER_CONTEXT_METRIC_TYPES)
# Distinct tag lists kept at once: a node's GPUs, MIG instances, links and processes under a few
# holders each stay far below it; past it (processes coming and going for days) all are dropped.
_TAG_LISTS_KEPT = 20_000


class Route(NamedTuple):
    name: str  # as the spec names it
    type: int  # the aggregator's
    namespaced: str  # as the aggregator receives it


class MetricSink:
    def __init__(self, check: AgentCheck):
        self._check = check
        self._normalized: Dict[Tuple[str, ...], List[str]] = {}
        self._aggregator = aggregator
        self._check_id = ""

    def open(self) -> None:
        """Where this run's series go. Newer bases submit through a proxy while the Agent probes a check,
        for the whole of that run (`_aggregator()`); older ones through the module. The Agent gives a check
        its ID after making it."""
        own = getattr(self._check, "_aggregator", None)
        self._aggregator = own() if own is not None else aggregator
        self._check_id = self._check.check_id

    def routes(self, names: AbstractSet[str]) -> Dict[str, Route]:
        """The way into the aggregator of each metric `metric_patterns` lets through."""
        routes = {}
        for name in names:
            namespaced = self._check._format_namespace(name)
            if self._check.should_send_metric(namespaced):
                routes[name] = Route(name, _TYPES[SPEC[name].type], namespaced)
        return routes

    def submit(self, route: Route, value: Optional[float], tags: Sequence[str]) -> None:
        self.submit_all(((route, value),), tags)

    def submit_all(self, series: Iterable[Tuple[Route, Optional[float]]], tags: Sequence[str]) -> None:
        """Series under one tag list; a value of None is not sent."""
        check = self._check
        normalized = self._normalized_once(tags)
        if normalized is None:
            # The base class drops a tag of these (None, or one it cannot decode, which it logs): its own
            # path, series by series, tells so as it would.
            for route, value in series:
                check._submit_metric(route.type, route.name, value, tags)
            return
        limiter, submit_metric, check_id = check.metric_limiter, self._aggregator.submit_metric, self._check_id
        for route, value in series:
            if value is None:
                continue
            if limiter is not None:
                if route.type not in _LIMITED_PER_CALL:
                    check._submit_metric(route.type, route.name, value, tags)
                    continue
                if limiter.is_reached():
                    continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                # The base class says what is wrong with it, or raises where no Agent runs.
                check._submit_metric(route.type, route.name, value, tags)
                continue
            # A list of its own for each series, as the base class hands over: the aggregator may keep it.
            submit_metric(check, check_id, route.type, route.namespaced, number, list(normalized), "", False)

    def _normalized_once(self, tags: Sequence[str]) -> Optional[List[str]]:
        """The tags as the base class normalizes them; None where it drops one."""
        key = tuple(tags)
        normalized = self._normalized.get(key)
        if normalized is None:
            normalized = self._check._normalize_tags_type(key)
            if len(normalized) != len(key):
                return None
            if len(self._normalized) >= _TAG_LISTS_KEPT:
                self._normalized.clear()
            self._normalized[key] = normalized
        return normalized
