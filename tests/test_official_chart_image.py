"""The custom Agent image's tag, read by the official chart exactly as the stock Agent release it
builds on, and which Agent containers the sidecar socket's mount reaches."""

import copy
import re
from typing import Any, Dict

import pytest
import yaml

from .deploy_support import (
    DATADOG_VALUES,
    agent_daemonset,
    datadog_chart_defaults,
    helm,
    merge_values,
    needs_datadog_chart,
    render_datadog,
)
from .official_chart_support import (
    FEATURES,
    VALUES_FILES,
    Render,
    render_raw,
    values_of,
)

pytestmark = needs_datadog_chart


# --- the image tag ------------------------------------------------------------------------------


def with_image(values: Dict[str, Any], **image: Any) -> Dict[str, Any]:
    changed = copy.deepcopy(values)
    changed["agents"]["image"] = dict(image)
    return changed


def stock_image_values(values: Dict[str, Any]) -> Dict[str, Any]:
    """The same values naming the stock Agent release in the same repository, no suffix."""
    image = values["agents"]["image"]
    return with_image(values, repository=image["repository"], tag=image["tag"])


def normalized(values: Dict[str, Any], stock: Dict[str, Any]) -> Dict[str, str]:
    """A render with this image's name replaced by the stock one's: what remains are the chart's
    choices."""
    ours = "{repository}:{tag}".format(**values["agents"]["image"])
    if values["agents"]["image"].get("tagSuffix"):
        ours += "-" + values["agents"]["image"]["tagSuffix"]
    theirs = "{repository}:{tag}".format(**stock["agents"]["image"])
    return {path: text.replace(f'"{ours}"', f'"{theirs}"') for path, text in render_raw(values).items()}


def feature_paths(raw: Dict[str, str]) -> Dict[str, Any]:
    """Code paths the chart picks by Agent version, as they show in a render."""
    objects = [d for p, t in raw.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]
    containers = {c["name"]: c for c in agent_daemonset(objects)["spec"]["template"]["spec"]["containers"]}
    rules = [rule for o in objects if o["kind"] == "ClusterRole" for rule in o.get("rules") or []]
    system_probe = "".join(t for p, t in raw.items() if p.endswith("system-probe-configmap.yaml"))
    return {
        "trace-loader": containers["trace-agent"]["command"][0] == "trace-loader",
        "system-probe": "system-probe" in containers,
        "process-agent flag": [a.split("=")[0] for a in containers.get("process-agent", {}).get("command", [])[1:]],
        "ksm controllerrevisions": any("controllerrevisions" in rule.get("resources", []) for rule in rules),
        "cnm direct send": re.findall(r"\bdirect_send: (\w+)", system_probe),
    }


@pytest.mark.parametrize("features", [{}, FEATURES], ids=["values-file", "many-features"])
@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_the_chart_reads_our_tag_as_the_stock_agent_release(path, features):
    """Every template, every feature: the render with our image equals the stock Agent's but for
    the image name."""
    values = merge_values(features, values_of(path))
    stock = stock_image_values(values)
    assert normalized(values, stock) == render_raw(stock)


# Other ways to name the image: the features rendered, and the paths each takes that the stock
# release does not.
OTHER_TAGS = {
    # The whole tag in agents.image.tag: semver reads -gpumon0.2.0 as a pre-release, which
    # constraints without a pre-release part (">=7.72.0", "^7.36.0") reject.
    "full-tag": ({"tag": "7.81.1-gpumon0.2.0"}, FEATURES, ["process-agent flag", "ksm controllerrevisions"]),
    # doNotCheckTag makes the chart assume an old Agent in some places and a new one in others.
    "full-tag-doNotCheckTag": (
        {"tag": "7.81.1-gpumon0.2.0", "doNotCheckTag": True},
        FEATURES,
        ["trace-loader", "process-agent flag", "cnm direct send"],
    ),
    # The tag this project used before, read as Agent 0.1.0 (with FEATURES the chart refuses it).
    "0.1.0-doNotCheckTag": (
        {"tag": "0.1.0", "doNotCheckTag": True},
        {},
        ["trace-loader", "system-probe", "cnm direct send"],
    ),
}


@pytest.mark.parametrize("variant", OTHER_TAGS)
def test_other_tags_take_other_paths(variant):
    image, features, differing = OTHER_TAGS[variant]
    values = merge_values(features, values_of(DATADOG_VALUES))
    other = with_image(values, repository=values["agents"]["image"]["repository"], **image)
    stock = stock_image_values(values)
    assert normalized(other, stock) != render_raw(stock)
    theirs, ours = feature_paths(render_raw(other)), feature_paths(render_raw(stock))
    assert [k for k in ours if theirs[k] != ours[k]] == differing


def test_our_tag_takes_the_same_paths_as_the_stock_release():
    values = merge_values(FEATURES, values_of(DATADOG_VALUES))
    assert feature_paths(render_raw(values)) == feature_paths(render_raw(stock_image_values(values)))


def test_the_old_tag_without_do_not_check_tag_is_refused():
    values = with_image(values_of(DATADOG_VALUES), repository="registry.example.com/datadog-agent-gpu", tag="0.1.0")
    with pytest.raises(helm.HelmRenderError, match=r"requires an agent image 7\.36\.0 or greater"):
        render_raw(values)


# --- where agents.volumeMounts goes -------------------------------------------------------------


def test_the_chart_has_no_volume_mounts_of_the_agent_container_alone():
    containers = datadog_chart_defaults()["agents"]["containers"]
    assert "volumeMounts" not in containers["agent"]
    # Some containers have one, so the absence is not a naming difference.
    assert "volumeMounts" in containers["otelAgent"]
    # And the chart ignores one set anyway.
    values = values_of(DATADOG_VALUES)
    per_container = {"agents": {"containers": {"agent": {"volumeMounts": values["agents"]["volumeMounts"]}}}}
    ignored = merge_values(values, per_container)
    assert render_raw(ignored) == render_raw(values)


def test_the_socket_mount_reaches_every_agent_container_read_only_and_alone_at_its_path():
    values = merge_values(FEATURES, values_of(DATADOG_VALUES))
    r = Render(values, render_datadog(values))
    (declared,) = values["agents"]["volumeMounts"]
    path = declared["mountPath"]
    assert set(r.containers) == {
        "agent",
        "trace-agent",
        "process-agent",
        "system-probe",
        "security-agent",
        "otel-agent",
        "host-profiler",
        "agent-data-plane",
        "private-action-runner",
    }
    for name, container in r.containers.items():
        assert declared in container["volumeMounts"], name
        # No chart mount at, above or below the socket directory: the mount neither hides nor is
        # hidden by anything these containers use.
        for mount in container["volumeMounts"]:
            if mount is declared or mount == declared:
                continue
            other = mount["mountPath"].rstrip("/")
            assert not (other == path or path.startswith(other + "/") or other.startswith(path + "/")), (name, other)
    for name, container in r.init_containers.items():
        assert declared not in container.get("volumeMounts", []), name
