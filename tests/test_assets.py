"""The dashboards and monitors in assets/, checked offline.

- They load into the official Datadog API client's models (`datadog-api-client`) with nothing left
  over: the client alone accepts unknown fields and keeps what it cannot parse as "unparsed", so
  the models are walked afterwards and any of those is an error.
- Every metric they query is in metadata.csv and is aggregated the way its type needs.
- Every tag key they filter or group on is one the check really submits on that series (found by
  running the check on the simulated scenarios), or one the Agent adds.
- Every service check they name is in assets/service_checks.json.
"""

import csv
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, NamedTuple, Set

import pytest
import yaml
from datadog_api_client import ApiClient, Configuration
from datadog_api_client.model_utils import (
    ModelComposed,
    ModelNormal,
    ModelSimple,
    OpenApiModel,
    UnparsedObject,
    change_keys_js_to_python,
    data_to_dict,
)
from datadog_api_client.v1.model.dashboard import Dashboard
from datadog_api_client.v1.model.monitor import Monitor
from datadog_checks.base.stubs import aggregator as stub_aggregator

from gpu_monitoring import GpuMonitoringCheck, simulator, xid
from gpu_monitoring.metric_spec import SPEC

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"
DASHBOARD_FILES = sorted((ASSETS / "dashboards").glob("*.json"))
MONITOR_FILES = sorted((ASSETS / "monitors").glob("*.json"))
NAMESPACE = "gpu_monitoring."
METADATA = {row["metric_name"]: row for row in csv.DictReader((ROOT / "metadata.csv").read_text().splitlines())}
SERVICE_CHECKS = {entry["check"]: entry for entry in json.loads((ASSETS / "service_checks.json").read_text())}
INTERVAL = 15

# Tag keys the Agent itself puts on what the check submits; the check never sets them.
AGENT_TAG_KEYS = {
    # The Agent's hostname, on every series, service check and event.
    "host",
    # The Agent's host tag on Kubernetes (its `cluster_name` setting or the detected cluster name).
    "kube_cluster_name",
}
# The pod tags (pod_name, kube_namespace, kube_container_name, container_id) are not listed: the
# check sets them itself where a container holds a GPU. The Agent's tagger, when it knows the
# container, gives these same keys and more (kube_deployment, user pod labels...); the assets use
# only the four the check sets without it, so they work on either path.

TEMPLATE_VARIABLES = {
    "host": "host",
    "cluster": "kube_cluster_name",
    "namespace": "kube_namespace",
    "gpu_model": "gpu_model",
    "gpu_uuid": "gpu_uuid",
}

# Gauges in these units make no sense summed across series (a sum of temperatures or of
# utilization percentages of different GPUs)...
NOT_SUMMABLE_UNITS = {"percent", "degree celsius"}
# ...except these, where the sum has a meaning of its own.
SUMMABLE_PERCENTS = {
    # SM percent of the device used by each container: summed over the containers of a namespace
    # or of a shared GPU, /100 gives busy GPU-equivalents (the device's SM use for a shared GPU).
    "gpu_monitoring.workload.sm_utilization",
}

# What each dashboard must show.
REQUIRED = {
    "gpu_monitoring_fleet_overview.json": {
        "title": "GPU Monitoring - Fleet overview",
        "metrics": {
            "fleet.devices.total", "fleet.devices.allocated", "fleet.devices.active", "fleet.devices.effective",
            "utilization.gpu", "sm_active", "memory.used", "memory.total", "power.usage", "temperature",
            "xid_errors", "cost.hourly", "cost.idle_hourly",
        },
        "widgets": {"heatmap", "check_status", "list_stream", "query_value", "toplist"},
        "checks": {"gpu_monitoring.device.health"},
    },
    "gpu_monitoring_kubernetes_workloads.json": {
        "title": "GPU Monitoring - Kubernetes workloads",
        "metrics": {
            "workload.gpus", "workload.memory.used", "workload.sm_utilization", "workload.sm_limit",
            "workload.idle", "workload.cost.hourly", "workload.cost.idle_hourly",
        },
        "widgets": {"timeseries", "toplist", "query_table"},
        "checks": set(),
    },
    "gpu_monitoring_device_health.json": {
        "title": "GPU Monitoring - Device health and errors",
        "metrics": {
            "xid_errors", "ecc.errors.corrected", "ecc.errors.uncorrected", "remapped_rows.correctable",
            "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failed",
            "retired_pages.single_bit", "retired_pages.double_bit", "retired_pages.pending",
            "clocks_event.hw_thermal_slowdown", "clocks_event.sw_thermal_slowdown",
            "clocks_event.hw_power_brake_slowdown", "pcie.replay_errors", "nvlink.errors.crc_flit",
            "nvlink.errors.crc_data", "nvlink.errors.replay", "nvlink.errors.recovery", "temperature",
            "temperature.slowdown_threshold",
        },
        "widgets": {"timeseries", "toplist", "query_table", "check_status", "list_stream"},
        "checks": {"gpu_monitoring.device.health"},
    },
}


# --- what the check submits ------------------------------------------------------------------


class Emitted(NamedTuple):
    metrics: Dict[str, Set[str]]  # metric -> tag keys
    values: Dict[str, Set[str]]  # tag key -> values seen
    service_checks: Dict[str, Set[str]]  # service check -> tag keys
    events: Set[str]  # tag keys on events
    event_sources: Set[str]


def _scenarios(directory: Path) -> List[tuple]:
    """(simulate, runs, instance options): every stock scenario, and dgx-h100 with XIDs on GPUs pods
    hold (in the stock scenarios, XIDs only hit GPUs outside Kubernetes)."""
    held = yaml.safe_load((Path(simulator.__file__).parent / "scenarios" / "dgx-h100.yaml").read_text())
    held["faults"] = [
        {"at": 20, "kind": "xid", "device": 0, "xid": 48},
        {"at": 20, "kind": "xid", "device": 2, "xid": 13},
    ]
    held_path = directory / "dgx-h100-xids.yaml"
    held_path.write_text(yaml.safe_dump(held))
    return [
        ("dgx-h100", 3, {"hourly_price": {"NVIDIA H100*": 4.0}}),
        ("t4-shared", 3, {"default_hourly_price": 0.35}),
        ("a100-mig", 3, {"hourly_price": {"NVIDIA A100*": 3.0}}),
        ("legacy-driver", 2, {"default_hourly_price": 1.0}),
        # To t=120: the XIDs, a lost GPU, ECC, heat, then link faults and a driver reload.
        ("faults", 9, {"default_hourly_price": 2.0}),
        (str(held_path), 3, {"hourly_price": {"NVIDIA H100*": 4.0}}),
    ]


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> Emitted:
    metrics, values, checks = defaultdict(set), defaultdict(set), defaultdict(set)
    events, sources = set(), set()

    def collect():
        for name in stub_aggregator.metric_names:
            for stub in stub_aggregator.metrics(name):
                pairs = [tag.split(":", 1) for tag in stub.tags]
                metrics[name].update(key for key, _ in pairs)
                for key, value in pairs:
                    values[key].add(value)
        for name in list(stub_aggregator._service_checks):
            for stub in stub_aggregator.service_checks(name):
                checks[name].update(tag.split(":", 1)[0] for tag in stub.tags)
        for event in stub_aggregator.events:
            events.update(tag.split(":", 1)[0] for tag in event["tags"])
            sources.add(event["source_type_name"])
        stub_aggregator.reset()

    stub_aggregator.reset()
    for simulate, runs, options in _scenarios(tmp_path_factory.mktemp("scenarios")):
        check = GpuMonitoringCheck("gpu_monitoring", {}, [dict(options, simulate=simulate)])
        check.simulation.clock.set_speed(0)
        try:
            for run in range(runs):
                if run:
                    check.simulation.advance(INTERVAL)
                assert check.run() == "", f"{simulate}: run {run} failed"
                collect()
        finally:
            check.cancel()
    # Sidecar mode with no sidecar: the sidecar's service check, CRITICAL.
    check = GpuMonitoringCheck("gpu_monitoring", {}, [
        {"source": "sidecar", "sidecar_socket": str(tmp_path_factory.mktemp("sidecar") / "none.sock"),
         "kubernetes": "false"},
    ])
    try:
        assert check.run() == ""
        collect()
    finally:
        check.cancel()
    return Emitted(dict(metrics), dict(values), dict(checks), events, sources)


@pytest.fixture(scope="module")
def metric_tag_keys(emitted) -> Dict[str, Set[str]]:
    """Tag keys each metric can carry, the Agent's included.

    Device, MIG, process, workload and XID series are tagged by one builder per scope (metrics.yaml's
    `scope`), so a key seen on one metric of a scope applies to all of them: a scenario only shows
    pod tags where a pod holds a GPU with that feature. Node series are tagged one by one
    (devices.count with the instance's tags, fleet.* with gpu_model), so they are taken per metric.
    """
    by_scope = defaultdict(set)
    for name, keys in emitted.metrics.items():
        by_scope[SPEC[name[len(NAMESPACE):]].scope] |= keys
    keys = {}
    for metric in SPEC.values():
        seen = emitted.metrics.get(metric.full_name, set()) if metric.scope == "node" else by_scope[metric.scope]
        keys[metric.full_name] = seen | AGENT_TAG_KEYS
    return keys


def test_the_scenarios_show_every_scope_and_service_check(emitted):
    scopes = {SPEC[name[len(NAMESPACE):]].scope for name in emitted.metrics}
    assert scopes == {metric.scope for metric in SPEC.values()}
    assert {"pod_name", "kube_namespace", "xid_action"} <= emitted.metrics[NAMESPACE + "xid_errors"]
    assert {"gpu_parent_uuid", "mig_profile"} <= emitted.metrics[NAMESPACE + "memory.used"]
    assert {"mps", "time_slicing", "mig"} <= emitted.values["gpu_slicing_mode"]
    assert set(emitted.service_checks) == set(SERVICE_CHECKS)


# --- loading into the API client's models ----------------------------------------------------


def _client() -> ApiClient:
    return ApiClient(Configuration(discard_unknown_keys=False))


DISCRIMINATORS = ("type", "data_source")


def _accepts(cls, data: dict) -> bool:
    """Whether `data`'s discriminating fields (type, data_source) are values `cls` allows."""
    for field in DISCRIMINATORS:
        if field in data and field in cls.openapi_types:
            allowed = getattr(cls.openapi_types[field][0], "allowed_values", None)
            if allowed is not None and data[field] not in allowed:
                return False
    return True


def _candidates(types) -> list:
    """The model classes a field's types allow, a oneOf's alternatives included."""
    classes = []
    for t in types or ():
        if isinstance(t, list):
            classes += _candidates(tuple(t))
        elif isinstance(t, type) and issubclass(t, ModelComposed):
            classes += _candidates(tuple(t._composed_schemas.get("oneOf", ())))
        elif isinstance(t, type) and issubclass(t, ModelNormal) and t is not UnparsedObject:
            classes.append(t)
    return classes


def _explain(data, types, path: str):
    """Why `data` matched none of its field's types: each candidate's error, or the problems inside it."""
    candidates = [cls for cls in _candidates(types) if isinstance(data, dict) and _accepts(cls, data)]
    if not candidates:
        shown = {f: data[f] for f in DISCRIMINATORS if isinstance(data, dict) and f in data}
        yield f"{path}: no model of {[t.__name__ for t in types or () if isinstance(t, type)]} takes {shown or data}"
    for cls in candidates:
        try:
            model = cls(**change_keys_js_to_python(data, cls), _spec_property_naming=True, _check_type=True,
                        _configuration=Configuration(discard_unknown_keys=False))
        except Exception as e:  # the client's own type, value and attribute errors
            yield f"{path} as {cls.__name__}: {e}"
            continue
        problems = list(_problems(model, path, (cls,)))
        yield from problems or [f"{path}: {cls.__name__} rejects it"]


def _inner(types):
    """The element types of a list or dict field's types."""
    for t in types or ():
        if isinstance(t, list):
            return tuple(t)
        if isinstance(t, dict):
            return next(iter(t.values()))
    return None


def _problems(value, path: str, types=None):
    """Everything the client accepted without understanding it: unknown fields, values it could not
    parse (kept as UnparsedObject), enum values outside the allowed ones."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield from _problems(item, f"{path}[{i}]", _inner(types))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _problems(item, f"{path}.{key}", _inner(types))
    elif isinstance(value, UnparsedObject):
        yield from _explain(value._data_store, types, path)
    elif isinstance(value, ModelSimple):
        if value._unparsed:
            yield f"{path}: {value.value!r} is not one of {sorted(value.allowed_values)}"
    elif isinstance(value, ModelComposed):
        if not value._composed_instances:
            yield f"{path}: matches none of {type(value).__name__}'s schemas"
        for instance in value._composed_instances:
            # An unparsed instance is explained against the oneOf it failed to match.
            yield from _problems(instance, path, (type(value if isinstance(instance, UnparsedObject) else instance),))
    elif isinstance(value, OpenApiModel):
        unknown = set(value._data_store) - set(value.attribute_map)
        if unknown:
            yield f"{path}: {type(value).__name__} has no field {', '.join(sorted(unknown))}"
        for key, item in value._data_store.items():
            if key in value.attribute_map:
                yield from _problems(item, f"{path}.{key}", value.openapi_types[key])


def load_strictly(text: str, model_class):
    """`text` deserialized by the API client into `model_class`, as it deserializes API responses,
    then checked for anything the client let through without understanding it."""
    with _client() as client:
        model = client.deserialize(text, (model_class,), True)
    problems = list(_problems(model, "$", (model_class,)))
    assert not problems, "\n".join(problems)
    assert not model._unparsed
    read_only = set(model._data_store) & set(model.read_only_vars)
    assert not read_only, f"read-only fields the API sets itself: {sorted(read_only)}"
    return model


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_dashboard_loads_into_the_api_model(path):
    model = load_strictly(path.read_text(), Dashboard)
    # Serialized back as the client would send it, it is the file: nothing dropped or coerced.
    assert data_to_dict(model) == json.loads(path.read_text())


@pytest.mark.parametrize("path", MONITOR_FILES, ids=lambda p: p.name)
def test_monitor_loads_into_the_api_model(path):
    model = load_strictly(json.dumps(_monitor(path)), Monitor)
    assert data_to_dict(model) == _monitor(path)


def _first_widget(board):
    return board["widgets"][0]["definition"]["widgets"][0]


BROKEN_DASHBOARDS = {
    "unknown top-level field": lambda d: d.update(widget=[]),
    "unknown field in a grouped widget": lambda d: _first_widget(d)["definition"].update(colour="red"),
    "enum value": lambda d: d.update(layout_type="grid"),
    "wrong type deep in a group": lambda d: _first_widget(d)["layout"].update(width="4"),
    "widget type that does not exist": lambda d: _first_widget(d)["definition"].update(type="pie"),
    "missing required field": lambda d: d.pop("title"),
}
BROKEN_MONITORS = {
    "unknown option": lambda m: m["options"].update(notify_nodata=True),
    "monitor type": lambda m: m.update(type="metric_alert"),
    "threshold type": lambda m: m["options"]["thresholds"].update(critical="high"),
    "read-only field": lambda m: m.update(id=1),
}


@pytest.mark.parametrize("breakage", BROKEN_DASHBOARDS, ids=str)
def test_a_broken_dashboard_does_not_load(breakage):
    board = json.loads(DASHBOARD_FILES[0].read_text())
    BROKEN_DASHBOARDS[breakage](board)
    with pytest.raises((AssertionError, TypeError, ValueError)):
        load_strictly(json.dumps(board), Dashboard)


@pytest.mark.parametrize("breakage", BROKEN_MONITORS, ids=str)
def test_a_broken_monitor_does_not_load(breakage):
    monitor = _monitor(MONITOR_FILES[0])
    BROKEN_MONITORS[breakage](monitor)
    with pytest.raises((AssertionError, TypeError, ValueError)):
        load_strictly(json.dumps(monitor), Monitor)


# --- queries ---------------------------------------------------------------------------------

METRIC_QUERY = re.compile(
    r"(?P<space>\w+):(?P<metric>gpu_monitoring\.[\w.]+)\{(?P<filter>[^{}]*)\}"
    r"(?:\s*by\s*\{(?P<by>[^{}]*)\})?(?P<functions>(?:\.\w+\([^()]*\))*)"
)
IN_LIST = re.compile(r"(?P<key>[\w.\-/]+)\s+(?:NOT\s+)?IN\s*\([^()]*\)")
SEPARATORS = re.compile(r",|\(|\)|\s+(?:AND|OR|NOT)\s+|^\s*NOT\s+")


class MetricRef(NamedTuple):
    metric: str
    space: str
    filter_keys: Set[str]
    filter_values: Dict[str, Set[str]]
    variables: Set[str]
    by: List[str]
    functions: List[str]


def parse_filter(text: str):
    """(tag keys, {key: values}, template variable names) of a `{...}` filter or an event search."""
    keys, values, variables = set(), defaultdict(set), set()
    for match in IN_LIST.finditer(text):
        keys.add(match["key"])
    text = IN_LIST.sub(",", text)
    for token in SEPARATORS.split(text):
        token = token.strip().lstrip("!-")
        if not token or token == "*":
            continue
        if token.startswith("$"):
            variables.add(token[1:].split(".")[0])
        else:
            key, _, value = token.partition(":")
            keys.add(key)
            values[key].add(value)
    return keys, dict(values), variables


def metric_refs(query: str) -> List[MetricRef]:
    refs = []
    for match in METRIC_QUERY.finditer(query):
        keys, values, variables = parse_filter(match["filter"])
        by = [key.strip() for key in (match["by"] or "").split(",") if key.strip()]
        refs.append(MetricRef(
            match["metric"], match["space"], keys, values, variables, by,
            re.findall(r"\.(\w+)\(", match["functions"]),
        ))
    named = re.findall(r"gpu_monitoring\.[\w.]+", query)
    assert len(named) == len(refs), f"unparsed metric in {query!r}"
    return refs


class WidgetQuery(NamedTuple):
    where: str
    kind: str  # metric | event | check
    text: str
    aggregator: str  # a scalar widget's reduction over time, or ""
    definition: dict  # the widget's


def widget_queries(board: dict) -> List[WidgetQuery]:
    found = []

    def walk(widgets, where):
        for widget in widgets:
            definition = widget["definition"]
            here = f"{where} > {definition.get('title') or definition['type']}"
            if definition["type"] == "group":
                walk(definition["widgets"], here)
                continue
            if definition["type"] == "check_status":
                found.append(WidgetQuery(here, "check", definition["check"], "", definition))
            for event in definition.get("events", []):
                found.append(WidgetQuery(here, "event", event["q"], "", definition))
            for request in definition.get("requests", []):
                if "q" in request:
                    found.append(WidgetQuery(here, "metric", request["q"], "", definition))
                for query in request.get("queries", []):
                    assert query["data_source"] == "metrics", f"{here}: unexpected data source"
                    found.append(WidgetQuery(here, "metric", query["query"], query.get("aggregator", ""), definition))
                if "query" in request:
                    assert request["query"]["data_source"] == "event_stream", f"{here}: unexpected list stream"
                    found.append(WidgetQuery(here, "event", request["query"]["query_string"], "", definition))

    walk(board["widgets"], board["title"])
    return found


def _strings(value, key=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, k)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, key)
    elif isinstance(value, str):
        yield key, value


PROSE = {"title", "description", "content", "alias", "label"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _monitor(path: Path) -> dict:
    """The API definition inside a recommended-monitor file (version, title, description, definition)."""
    return _load(path)["definition"]


def _all_refs():
    """(where, MetricRef, a scalar widget's reduction over time or "", a monitor's time aggregation or None)."""
    for path in DASHBOARD_FILES:
        for query in widget_queries(_load(path)):
            if query.kind == "metric":
                for ref in metric_refs(query.text):
                    yield f"{path.name}: {query.where}", ref, query.aggregator, None
    for path in MONITOR_FILES:
        monitor = _monitor(path)
        if monitor["type"] == "query alert":
            time_aggregation = parse_metric_monitor(monitor["query"])["time"]
            for ref in metric_refs(monitor["query"]):
                yield path.name, ref, "", time_aggregation


def test_assets_exist():
    assert {p.name for p in DASHBOARD_FILES} == set(REQUIRED)
    assert len(MONITOR_FILES) >= 10


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_every_query_in_a_dashboard_is_found(path):
    """Nothing that names a metric escapes the checks below: every such string is a query they read."""
    board = _load(path)
    read = {query.text for query in widget_queries(board)}
    for key, text in _strings(board):
        if key not in PROSE and "gpu_monitoring." in text:
            assert text in read, f"{path.name}: {key}={text!r} is not read as a query"


def test_every_metric_exists_in_metadata():
    for where, ref, _, _ in _all_refs():
        assert ref.metric in METADATA, f"{where}: {ref.metric} is not in metadata.csv"


def test_aggregation_fits_the_metric_type():
    for where, ref, scalar, time_aggregation in _all_refs():
        row = METADATA[ref.metric]
        assert ref.space in ("avg", "sum", "min", "max"), f"{where}: {ref.metric} aggregated with {ref.space}"
        as_count = {"as_count", "as_rate"} & set(ref.functions)
        if row["metric_type"] == "count":
            # A count holds the increase per interval: summed across series, queried as a count or a rate.
            assert ref.space == "sum", f"{where}: count {ref.metric} aggregated with {ref.space}"
            assert as_count, f"{where}: count {ref.metric} without .as_count() or .as_rate()"
            if "as_count" in ref.functions:
                assert scalar in ("", "sum"), f"{where}: count {ref.metric} reduced with {scalar}, not sum"
                assert time_aggregation in (None, "sum"), f"{where}: count {ref.metric} over {time_aggregation}"
        else:
            assert row["metric_type"] == "gauge", ref.metric
            assert not as_count, f"{where}: gauge {ref.metric} queried {as_count}"
            # A sum over time of a gauge's points depends on how often it was sampled.
            assert scalar != "sum", f"{where}: gauge {ref.metric} reduced over time with sum"
            assert time_aggregation != "sum", f"{where}: gauge {ref.metric} summed over the monitor's window"
            if row["unit_name"] in NOT_SUMMABLE_UNITS and ref.metric not in SUMMABLE_PERCENTS:
                assert ref.space != "sum", f"{where}: {ref.metric} ({row['unit_name']}) summed across series"


def test_every_tag_key_is_one_the_check_submits(metric_tag_keys):
    for where, ref, _, _ in _all_refs():
        allowed = metric_tag_keys[ref.metric]
        for key in ref.filter_keys | set(ref.by):
            assert key in allowed, f"{where}: {ref.metric} has no tag {key} (it has {sorted(allowed)})"
        for variable in ref.variables:
            assert variable in TEMPLATE_VARIABLES, f"{where}: unknown template variable ${variable}"
            assert TEMPLATE_VARIABLES[variable] in allowed, f"{where}: ${variable} does not apply to {ref.metric}"


def test_filtered_tag_values_are_ones_the_check_submits(emitted):
    known = {
        "xid_action": set(xid.ADVICE),
        "xid_origin": {x.origin for x in xid.CATALOG.values()} | {"unknown"},
        "xid": {str(code) for code in xid.CATALOG},
        "gpu_slicing_mode": emitted.values["gpu_slicing_mode"],
    }
    for where, ref, _, _ in _all_refs():
        for key, values in ref.filter_values.items():
            if key in known:
                assert values <= known[key], f"{where}: {key} has no value {sorted(values - known[key])}"


# --- dashboards ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_dashboard_layout(path):
    board = _load(path)
    assert board["title"] == REQUIRED[path.name]["title"]
    assert board["layout_type"] == "ordered"
    assert {v["name"]: v["prefix"] for v in board["template_variables"]} == TEMPLATE_VARIABLES
    ids = []
    y = 0
    for group in board["widgets"]:
        # Every widget sits in a group; the groups stack down the page.
        assert group["definition"]["type"] == "group", f"{path.name}: a widget outside the groups"
        assert group["layout"]["y"] == y and group["layout"]["width"] == 12
        y += group["layout"]["height"]
        ids.append(group["id"])
        cells = set()
        bottom = 0
        for widget in group["definition"]["widgets"]:
            ids.append(widget["id"])
            box = widget["layout"]
            assert box["x"] + box["width"] <= 12, f"{path.name}: {widget['definition']} is wider than the grid"
            area = {(x, y_) for x in range(box["x"], box["x"] + box["width"])
                    for y_ in range(box["y"], box["y"] + box["height"])}
            assert not area & cells, f"{path.name}: widgets overlap in {group['definition']['title']}"
            cells |= area
            bottom = max(bottom, box["y"] + box["height"])
        assert group["layout"]["height"] == bottom + 1, f"{path.name}: {group['definition']['title']} height"
    assert len(ids) == len(set(ids)), f"{path.name}: widget ids repeat"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_dashboard_shows_what_it_is_for(path):
    board = _load(path)
    required = REQUIRED[path.name]
    queries = widget_queries(board)
    metrics = {ref.metric[len(NAMESPACE):] for q in queries if q.kind == "metric" for ref in metric_refs(q.text)}
    assert required["metrics"] <= metrics, f"missing {sorted(required['metrics'] - metrics)}"
    types = set()

    def walk(widgets):
        for widget in widgets:
            types.add(widget["definition"]["type"])
            walk(widget["definition"].get("widgets", []))

    walk(board["widgets"])
    assert required["widgets"] <= types
    assert required["checks"] <= {q.text for q in queries if q.kind == "check"}


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_formulas_use_the_queries_of_their_request(path):
    def walk(widgets):
        for widget in widgets:
            definition = widget["definition"]
            walk(definition.get("widgets", []))
            for request in definition.get("requests", []):
                if "queries" not in request:
                    continue
                names = [q["name"] for q in request["queries"]]
                assert len(names) == len(set(names)), definition["title"]
                used = set()
                for formula in request["formulas"]:
                    words = set(re.findall(r"[A-Za-z_]\w*", formula["formula"]))
                    assert words <= set(names), f"{definition['title']}: {formula['formula']}"
                    used |= words
                assert used == set(names), f"{definition['title']}: queries never shown {set(names) - used}"

    walk(_load(path)["widgets"])


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_every_query_uses_the_template_variables_that_apply(path, metric_tag_keys, emitted):
    """A template variable filters every query whose series carry its tag, and none other."""
    board = _load(path)
    for query in widget_queries(board):
        if query.kind == "metric":
            for ref in metric_refs(query.text):
                applies = {v for v, key in TEMPLATE_VARIABLES.items() if key in metric_tag_keys[ref.metric]}
                assert ref.variables == applies, f"{query.where}: {ref.metric} uses {ref.variables}, not {applies}"
        else:
            seen = emitted.events if query.kind == "event" else emitted.service_checks.get(query.text, set())
            keys = seen | AGENT_TAG_KEYS
            applies = {v for v, key in TEMPLATE_VARIABLES.items() if key in keys}
            text = query.text if query.kind == "event" else ",".join(query.definition["tags"])
            filter_keys, values, variables = parse_filter(text.replace(" ", ","))
            assert variables == applies, f"{query.where}: uses {variables}, not {applies}"
            if query.kind == "event":
                # Events are the check's XIDs, found by their source.
                assert values.get("source") == emitted.event_sources == {"gpu_monitoring"}, query.where
                filter_keys -= {"source"}
            assert filter_keys <= keys, f"{query.where}: no tag {filter_keys - keys}"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_dashboard_service_checks_exist(path, emitted):
    board = _load(path)
    for query in widget_queries(board):
        if query.kind == "check":
            assert query.text in SERVICE_CHECKS, f"{query.where}: {query.text} is not in service_checks.json"
            keys = emitted.service_checks[query.text] | AGENT_TAG_KEYS
            group_by = set(query.definition["group_by"])
            assert group_by <= keys, f"{query.where}: {query.text} has no tag {group_by - keys}"


# --- monitors --------------------------------------------------------------------------------

MONITOR_QUERY = re.compile(
    r"^(?:(?P<change>change|pct_change)\()?(?P<time>avg|sum|min|max|last)\((?P<window>last_\d+[mhdw])\)"
    r"(?:,(?P<shift>last_\d+[mhdw])\))?:(?P<expression>.+?)\s*(?P<op>>=|<=|>|<)\s*(?P<threshold>-?\d+(?:\.\d+)?)$"
)
SERVICE_CHECK_QUERY = re.compile(
    r'^"(?P<check>[\w.]+)"\.over\((?P<over>[^()]*)\)\.by\((?P<by>[^()]*)\)'
    r"\.last\((?P<last>\d+)\)\.count_by_status\(\)$"
)
MONITOR_FIELDS = {"name", "type", "query", "message", "tags", "options", "priority"}


def _monitor_files(monitor_type: str) -> List[Path]:
    return [path for path in MONITOR_FILES if _monitor(path)["type"] == monitor_type]


def parse_metric_monitor(query: str) -> dict:
    match = MONITOR_QUERY.match(query)
    assert match, f"not a metric monitor query: {query!r}"
    return match.groupdict()


def monitor_group_keys(monitor: dict) -> List[str]:
    if monitor["type"] == "service check":
        match = SERVICE_CHECK_QUERY.match(monitor["query"])
        return [key.strip().strip('"') for key in match["by"].split(",")]
    groups = {tuple(ref.by) for ref in metric_refs(monitor["query"])}
    assert len(groups) == 1, f"the series of a formula must be grouped alike: {groups}"
    return list(groups.pop())


@pytest.mark.parametrize("path", MONITOR_FILES, ids=lambda p: p.name)
def test_monitor_fields(path):
    monitor = _monitor(path)
    assert set(monitor) == MONITOR_FIELDS
    assert monitor["type"] in ("query alert", "service check")
    assert 1 <= monitor["priority"] <= 5
    assert "integration:gpu_monitoring" in monitor["tags"]


@pytest.mark.parametrize("path", _monitor_files("query alert"), ids=lambda p: p.name)
def test_metric_monitor_thresholds(path):
    monitor = _monitor(path)
    query = parse_metric_monitor(monitor["query"])
    thresholds = monitor["options"]["thresholds"]
    # The API refuses a critical threshold that differs from the query's.
    assert float(thresholds["critical"]) == float(query["threshold"])
    if "warning" in thresholds:
        if query["op"].startswith(">"):
            assert thresholds["warning"] < thresholds["critical"]
        else:
            assert thresholds["warning"] > thresholds["critical"]
    assert metric_refs(monitor["query"]), "a metric monitor queries the check's metrics"


@pytest.mark.parametrize("path", _monitor_files("service check"), ids=lambda p: p.name)
def test_service_check_monitor(path, emitted):
    monitor = _monitor(path)
    match = SERVICE_CHECK_QUERY.match(monitor["query"])
    assert match, f"not a service check query: {monitor['query']!r}"
    assert match["check"] in SERVICE_CHECKS, f"{match['check']} is not in assets/service_checks.json"
    keys = emitted.service_checks[match["check"]] | AGENT_TAG_KEYS
    group_keys = set(monitor_group_keys(monitor))
    assert group_keys <= keys, f"{match['check']} has no tag {group_keys - keys}"
    thresholds = monitor["options"]["thresholds"]
    # The monitor looks at the last N statuses; N must cover the largest threshold.
    assert int(match["last"]) >= max(thresholds.values())


def test_every_service_check_has_a_monitor():
    watched = {SERVICE_CHECK_QUERY.match(_monitor(path)["query"])["check"] for path in _monitor_files("service check")}
    assert set(SERVICE_CHECKS) <= watched


@pytest.mark.parametrize("path", MONITOR_FILES, ids=lambda p: p.name)
def test_monitor_message_tells_what_to_do(path):
    monitor = _monitor(path)
    message = monitor["message"]
    alert = re.search(r"\{\{#is_alert\}\}(.*?)\{\{/is_alert\}\}", message, re.S)
    assert alert and len(alert[1].strip()) > 100, "an alert section that says what to do"
    for block in ("is_alert", "is_warning", "is_recovery", "is_exact_match"):
        assert len(re.findall(r"\{\{#" + block + r"\b", message)) == message.count("{{/" + block + "}}"), block
    if "warning" in monitor["options"]["thresholds"] and monitor["type"] == "query alert":
        assert "{{#is_warning}}" in message
    # Tag variables only exist for the keys the monitor groups by.
    groups = set(monitor_group_keys(monitor))
    used = set(re.findall(r"\{\{(\w+)\.name\}\}", monitor["name"] + message))
    used |= set(re.findall(r'is_exact_match "(\w+)\.name"', message))
    assert used <= groups, f"variables {used - groups} are not in the monitor's groups {groups}"
    assert used, "the message names the GPU, pod, host or cluster it is about"
    if monitor["type"] == "service check":
        assert "{{check_message}}" in message


def test_manifest_lists_every_dashboard_and_monitor():
    manifest = json.loads((ROOT / "manifest.json").read_text())["assets"]
    assert sorted(manifest["dashboards"].values()) == sorted(str(p.relative_to(ROOT)) for p in DASHBOARD_FILES)
    assert sorted(manifest["monitors"].values()) == sorted(str(p.relative_to(ROOT)) for p in MONITOR_FILES)
    for title, path in manifest["monitors"].items():
        recommended = _load(ROOT / path)
        assert recommended["title"] == title and recommended["version"] == 2
        assert "{{" not in title and recommended["description"]
    for title, path in manifest["dashboards"].items():
        assert _load(ROOT / path)["title"] == title
