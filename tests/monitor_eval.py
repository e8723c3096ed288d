"""A recommended metric monitor's query evaluated offline on what the check submitted, run after run:
which groups it would alert on. Enough of Datadog's query language for the monitors in assets/monitors:
`{*}`, `key:value` and `!key:*` filters, a space aggregation per group, arithmetic between series
grouped alike, a time aggregation over the runs given (the monitor's window) and the threshold.
"""

import ast
import operator
from statistics import mean
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from .assets_support import METRIC_QUERY, MetricRef, metric_refs, parse_metric_monitor

# What one run submitted: {metric name: [(tags, value), ...]}.
Run = Mapping[str, Sequence[Tuple[Sequence[str], float]]]
Group = Tuple[str, ...]

SPACE: Dict[str, Callable[[List[float]], float]] = {"max": max, "min": min, "sum": sum, "avg": mean}
TIME: Dict[str, Callable[[List[float]], float]] = {**SPACE, "last": lambda values: values[-1]}
COMPARE = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
# The Agent tags every series with its host; the stub aggregator has none, so all are one host's.
HOST = "host"


def alerting(query: str, runs: Sequence[Run]) -> Set[Group]:
    """The groups (tag values in the order of the query's `by`) whose value over `runs` crosses the threshold."""
    parsed = parse_metric_monitor(query)
    if parsed["change"] or parsed["shift"]:
        raise NotImplementedError(f"change() is not evaluated: {query!r}")
    refs = metric_refs(parsed["expression"])
    if any(ref.functions for ref in refs):
        raise NotImplementedError(f"functions on series are not evaluated: {query!r}")
    # Each series of the formula becomes a name its arithmetic reads.
    formula = METRIC_QUERY.sub(_Namer(), parsed["expression"])
    over_time: Dict[Group, List[float]] = {}
    for run in runs:
        per_ref = [_grouped(ref, run) for ref in refs]
        for group in set.intersection(*(set(values) for values in per_ref)):
            names = {f"q{i}": values[group] for i, values in enumerate(per_ref)}
            over_time.setdefault(group, []).append(_arithmetic(ast.parse(formula, mode="eval").body, names))
    compare, threshold = COMPARE[parsed["op"]], float(parsed["threshold"])
    # A group with no value in some run has none then: the monitor reads the runs it has.
    return {group for group, values in over_time.items() if compare(TIME[parsed["time"]](values), threshold)}


class _Namer:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, _match) -> str:
        self.count += 1
        return f"q{self.count - 1}"


def _grouped(ref: MetricRef, run: Run) -> Dict[Group, float]:
    found: Dict[Group, List[float]] = {}
    for tags, value in run.get(ref.metric, ()):
        pairs = dict(tag.split(":", 1) for tag in tags)
        pairs.setdefault(HOST, "")
        if _selected(ref, pairs):
            found.setdefault(tuple(pairs.get(key, "N/A") for key in ref.by), []).append(value)
    return {group: SPACE[ref.space](values) for group, values in found.items()}


def _selected(ref: MetricRef, tags: Dict[str, str]) -> bool:
    """Whether a series passes the filter: each `key:value` (`key:*`: any value) and none of the `!key:...`."""
    for key, values in ref.filter_values.items():
        matches = key in tags and ("*" in values or tags[key] in values)
        if matches == (key in ref.excluded):
            return False
    return True


def _arithmetic(node: ast.AST, names: Dict[str, float]) -> Optional[float]:
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arithmetic(node.operand, names)
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        return ARITHMETIC[type(node.op)](_arithmetic(node.left, names), _arithmetic(node.right, names))
    raise NotImplementedError(f"not evaluated: {ast.dump(node)}")
