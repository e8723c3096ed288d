"""What the tests of the dashboards and monitors in assets/ share.

- The asset files, and what each dashboard must show.
- What the check really submits (metrics and their tag keys, tag values, service checks, events),
  found by running it on the simulated scenarios with the profile the assets must work in: the
  `emitted` and `metric_tag_keys` fixtures.
- The metrics_profile each widget and monitor needs.
- Strict loading into the official Datadog API client's models (`datadog-api-client`): the client
  alone accepts unknown fields and keeps what it cannot parse as "unparsed", so the models are
  walked afterwards and any of those is an error.
- Parsing of the queries in dashboards and monitors: metric references, filters, template variables.
"""

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
)
from datadog_checks.base.stubs import aggregator as stub_aggregator
from datadog_checks.base.stubs import tagger

from gpu_monitoring import simulator
from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.metrics.spec import PROFILES, SPEC

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"
DASHBOARD_FILES = sorted((ASSETS / "dashboards").glob("*.json"))
MONITOR_FILES = sorted((ASSETS / "monitors").glob("*.json"))
NAMESPACE = "gpu_monitoring."
SERVICE_CHECKS = {entry["check"]: entry for entry in json.loads((ASSETS / "service_checks.json").read_text())}
INTERVAL = 15
# Every dashboard widget and monitor works in the default metrics_profile: the scenarios run with it.
ASSETS_PROFILE = "standard"

# Tag keys the Agent itself puts on what the check submits; the check never sets them.
AGENT_TAG_KEYS = {
    # The Agent's hostname, on every series, service check and event.
    "host",
    # The Agent's host tag on Kubernetes (its `cluster_name` setting or the detected cluster name).
    "kube_cluster_name",
    # Host tags the capacity-planning widgets group by where the host carries them: the AWS, Google
    # Cloud and Azure integrations tag hosts with `instance-type`; `cloud_provider` is the user's own.
    "instance-type",
    "cloud_provider",
}
# The pod tags (pod_name, kube_namespace, kube_container_name, container_id) are not listed: the
# check sets them itself where a container holds a GPU. The Agent's tagger, when it knows the
# container, gives these same keys and more (kube_deployment, user pod labels...); the assets use
# only the four the check sets without it, so they work on either path.

TEMPLATE_VARIABLES = {
    "host": "host",
    "cluster": "kube_cluster_name",
    "namespace": "kube_namespace",
    "gpu_device": "gpu_device",
    "gpu_uuid": "gpu_uuid",
    # A pod label the Agent's tagger carries (kubernetes_pod_labels_as_tags): see TAGGER_TAGS.
    "team": "team",
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
        # With a dcgm-exporter URL where none listens: the DCGM service check, CRITICAL.
        ("legacy-driver", 2, {"default_hourly_price": 1.0, "dcgm_exporter_url": "http://127.0.0.1:1/metrics"}),
        ("hpc-slurm", 3, {}),  # Slurm jobs, priced by the scenario's own models
        ("hgx-b200", 3, {}),  # NVLink fabric, the recovery action (t=25)
        ("gh200", 3, {}),  # C2C links
        # To t=120: the XIDs, a lost GPU, ECC, heat, then link faults and a driver reload.
        ("faults", 9, {"default_hourly_price": 2.0}),
        ("gpu-missing", 2, {}),  # a GPU on the bus NVML does not list: unusable capacity, priced
        (str(held_path), 3, {"hourly_price": {"NVIDIA H100*": 4.0}}),
        # NVLink 5's counters answer only on Blackwell.
        (str(Path(__file__).parent / "data" / "nvlink5-board.yaml"), 3, {}),
    ]


def _run_simulated(simulate: str, runs: int, options: dict, collect, tagged: bool = False) -> None:
    """`runs` runs of the check on a simulated scenario, INTERVAL apart, `collect` after each; with
    `tagged`, the Agent's tagger knows every container, with a `team` tag from a pod label."""
    check = GpuMonitoringCheck("gpu_monitoring", {}, [dict(options, simulate=simulate)])
    check.simulated_node.nvml.clock.set_speed(0)
    if tagged:
        tagger.set_tags(_tagger_tags(check.simulated_node.pods))
    try:
        for run in range(runs):
            if run:
                check.simulated_node.nvml.advance(INTERVAL)
            assert check.run() == "", f"{simulate}: run {run} failed"
            collect()
    finally:
        check.cancel()
        tagger.reset()


def _tagger_tags(pods: List[dict]) -> Dict[str, List[str]]:
    """What the Agent's tagger says of each simulated container, with its namespace as a `team` label."""
    known = {}
    for pod in pods:
        for container in pod["containers"]:
            known[f"container_id://{container['container_id']}"] = [
                f"pod_name:{pod['name']}", f"kube_namespace:{pod['namespace']}",
                f"kube_container_name:{container['name']}", f"container_id:{container['container_id']}",
                f"team:{pod['namespace']}",
            ]
    return known


@pytest.fixture(scope="session")
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
        _run_simulated(simulate, runs, dict(options, metrics_profile=ASSETS_PROFILE), collect)
    # The Agent's tagger knows the containers: its tags, a user's pod label among them, replace ours.
    _run_simulated("dgx-h100", 2, {"hourly_price": {"NVIDIA H100*": 4.0}, "metrics_profile": ASSETS_PROFILE},
                   collect, tagged=True)
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


# The boards whose GPUs have parts with series of their own: NVLink links, NVLink 5, C2C links.
PART_SCENARIOS = ("dgx-h100", "hgx-b200", "gh200")


@pytest.fixture(scope="session")
def part_tag_keys(emitted) -> Dict[str, Set[str]]:
    """The tag keys of a GPU part's series (nvlink_port, c2c_link...), per metric: seen when the boards
    with parts run with every series sent, never in the profile the assets work in, yet keys the check
    submits (`reads_parts` says which profile a query of them needs)."""
    seen = defaultdict(set)

    def collect():
        for name in stub_aggregator.metric_names:
            for stub in stub_aggregator.metrics(name):
                seen[name].update(tag.split(":", 1)[0] for tag in stub.tags)
        stub_aggregator.reset()

    stub_aggregator.reset()
    for simulate in PART_SCENARIOS:
        _run_simulated(simulate, 2, {"metrics_profile": PROFILES[-1]}, collect)
    return {name: keys - emitted.metrics.get(name, set()) for name, keys in seen.items()
            if SPEC[name[len(NAMESPACE):]].part_profile}


@pytest.fixture(scope="session")
def metric_tag_keys(emitted, part_tag_keys) -> Dict[str, Set[str]]:
    """Tag keys each metric can carry, its parts' and the Agent's included.

    Device, MIG, process, workload and XID series are tagged by one builder per scope (metrics.yaml's
    `scope`), so a key seen on one metric of a scope applies to all of them: a scenario only shows
    pod tags where a pod holds a GPU with that feature. Node series are tagged one by one
    (devices.count with the instance's tags, fleet.* with gpu_device), so they are taken per metric.
    """
    by_scope = defaultdict(set)
    for name, keys in emitted.metrics.items():
        by_scope[SPEC[name[len(NAMESPACE):]].scope] |= keys
    keys = {}
    for metric in SPEC.values():
        seen = emitted.metrics.get(metric.full_name, set()) if metric.scope == "node" else by_scope[metric.scope]
        keys[metric.full_name] = seen | AGENT_TAG_KEYS | part_tag_keys.get(metric.full_name, set())
    return keys


def reads_parts(ref) -> bool:
    """Whether a MetricRef reads the series of a GPU's parts (one per NVLink link...): it groups by or
    filters on the part's tag (metrics.yaml's `part_tag`), not merely to leave them out (`!tag:*`)."""
    tag = SPEC[ref.metric[len(NAMESPACE):]].part_tag
    return bool(tag) and tag in ((ref.filter_keys - ref.excluded) | set(ref.by))


def needed_profile(refs) -> str:
    """The smallest metrics_profile that sends every series `refs` (MetricRefs) read: a part's series
    are sent with the metric's part profile, a GPU's own with its profile. Service checks and events,
    sent in every profile, need the smallest."""
    ranks = [PROFILES.index(_metric(ref).parts_profile if reads_parts(ref) else _metric(ref).profile)
             for ref in refs]
    return PROFILES[max(ranks, default=0)]


def _metric(ref):
    return SPEC[ref.metric[len(NAMESPACE):]]


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
    excluded: Set[str]  # keys the filter leaves out: `!key:*`


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


def _excluded(text: str) -> Set[str]:
    return {token.strip()[1:].partition(":")[0] for token in SEPARATORS.split(text) if token.strip().startswith("!")}


def metric_refs(query: str) -> List[MetricRef]:
    refs = []
    for match in METRIC_QUERY.finditer(query):
        keys, values, variables = parse_filter(match["filter"])
        by = [key.strip() for key in (match["by"] or "").split(",") if key.strip()]
        refs.append(MetricRef(
            match["metric"], match["space"], keys, values, variables, by,
            re.findall(r"\.(\w+)\(", match["functions"]), _excluded(match["filter"]),
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


MONITOR_QUERY = re.compile(
    r"^(?:(?P<change>change|pct_change)\()?(?P<time>avg|sum|min|max|last)\((?P<window>last_\d+[mhdw])\)"
    r"(?:,(?P<shift>last_\d+[mhdw])\))?:(?P<expression>.+?)\s*(?P<op>>=|<=|>|<)\s*(?P<threshold>-?\d+(?:\.\d+)?)$"
)


def parse_metric_monitor(query: str) -> dict:
    match = MONITOR_QUERY.match(query)
    assert match, f"not a metric monitor query: {query!r}"
    return match.groupdict()


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
