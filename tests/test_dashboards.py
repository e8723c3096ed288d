"""The dashboards in assets/dashboards, checked offline: they load into the API client's Dashboard
model with nothing left over, every string that names a metric is a query the checks read, their
groups and widgets are laid out on the grid, each shows what it is for, every query is filtered
by the template variables that apply to it, and every widget names the metrics_profile it needs.
"""

import json
import re

import pytest
from datadog_api_client.model_utils import data_to_dict
from datadog_api_client.v1.model.dashboard import Dashboard

from gpu_monitoring.metrics.spec import PROFILES

from .assets_support import (
    AGENT_TAG_KEYS,
    ASSETS_PROFILE,
    DASHBOARD_FILES,
    NAMESPACE,
    REQUIRED,
    SERVICE_CHECKS,
    TEMPLATE_VARIABLES,
    _load,
    emitted,
    load_strictly,
    metric_refs,
    metric_tag_keys,
    needed_profile,
    parse_filter,
    part_tag_keys,
    reads_parts,
    widget_queries,
)

# Fixtures: pytest finds them among this module's names; listed so that linters see them used.
__all__ = ["emitted", "metric_tag_keys", "part_tag_keys"]


# --- loading into the API client's models ----------------------------------------------------


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_dashboard_loads_into_the_api_model(path):
    model = load_strictly(path.read_text(), Dashboard)
    # Serialized back as the client would send it, it is the file: nothing dropped or coerced.
    assert data_to_dict(model) == json.loads(path.read_text())


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


@pytest.mark.parametrize("breakage", BROKEN_DASHBOARDS, ids=str)
def test_a_broken_dashboard_does_not_load(breakage):
    board = json.loads(DASHBOARD_FILES[0].read_text())
    BROKEN_DASHBOARDS[breakage](board)
    with pytest.raises((AssertionError, TypeError, ValueError)):
        load_strictly(json.dumps(board), Dashboard)


# --- queries ---------------------------------------------------------------------------------


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


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_every_query_in_a_dashboard_is_found(path):
    """Nothing that names a metric escapes the checks below: every such string is a query they read."""
    board = _load(path)
    read = {query.text for query in widget_queries(board)}
    for key, text in _strings(board):
        if key not in PROSE and "gpu_monitoring." in text:
            assert text in read, f"{path.name}: {key}={text!r} is not read as a query"


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


# Formula functions the dashboards use (Datadog's algorithms: forecast(query, algorithm, deviations)).
FORMULA_FUNCTIONS = {"forecast"}


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
                    # A function's name and its quoted arguments are not queries.
                    text = re.sub(r"'[^']*'", "", formula["formula"])
                    functions = set(re.findall(r"([A-Za-z_]\w*)\s*\(", text))
                    assert functions <= FORMULA_FUNCTIONS, f"{definition['title']}: {formula['formula']}"
                    words = set(re.findall(r"[A-Za-z_]\w*", text)) - functions
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


PROFILE_NOTE = re.compile(r"Needs metrics_profile: (\w+)\b")


def _named_profile(description: str, where: str) -> str:
    named = PROFILE_NOTE.findall(description)
    assert len(named) == 1, f"{where}: the description names no metrics_profile, or more than one"
    return named[0]


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_every_widget_names_the_profile_it_needs(path):
    """Each widget's description names the smallest metrics_profile that sends all it queries. What a
    GPU sends of itself is sent in at most the default: every widget on those series works out of the
    box, and the dashboard names the largest of them. A widget on a GPU part's series (one per NVLink
    link) needs what sends the parts."""
    board = _load(path)
    widgets = {}  # id of a widget's definition -> (where, definition, metric refs it queries)
    for query in widget_queries(board):
        where, definition, refs = widgets.setdefault(id(query.definition), (query.where, query.definition, []))
        if query.kind == "metric":
            refs += metric_refs(query.text)
    assert widgets, f"{path.name}: no widget queries anything"
    needs = []
    for where, definition, refs in widgets.values():
        needed = needed_profile(refs)
        assert _named_profile(definition.get("description", ""), where) == needed, where
        if not any(map(reads_parts, refs)):
            assert PROFILES.index(needed) <= PROFILES.index(ASSETS_PROFILE), f"{where} needs {needed}"
            needs.append(needed)
    assert _named_profile(board["description"], path.name) == max(needs, key=PROFILES.index)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_dashboard_service_checks_exist(path, emitted):
    board = _load(path)
    for query in widget_queries(board):
        if query.kind == "check":
            assert query.text in SERVICE_CHECKS, f"{query.where}: {query.text} is not in service_checks.json"
            keys = emitted.service_checks[query.text] | AGENT_TAG_KEYS
            group_by = set(query.definition["group_by"])
            assert group_by <= keys, f"{query.where}: {query.text} has no tag {group_by - keys}"
