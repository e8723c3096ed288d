"""The Dockerfiles in deploy/docker: the Agent image, with the check installed the way Datadog
documents for community integrations and local mode's packages pinned and held to the Agent's
constraints; the sidecar image, non-root, whose entrypoint is the Helm chart's command."""

import json
import re
import shlex
from typing import Dict, List, Tuple

import yaml

from gpu_monitoring import __about__, deps

from .deploy_support import (
    AGENT_DOCKERFILE,
    DATADOG_VALUES,
    DATADOG_VALUES_LOCAL,
    ROOT,
    SIDECAR_DOCKERFILE,
    chart_values,
    daemonset,
    dockerfile,
    dockerfile_args,
    needs_helm,
    sidecar_container,
)

AGENT_BASE_IMAGE = "gcr.io/datadoghq/agent"


def copy_sources(arguments: str) -> List[str]:
    tokens = [t for t in shlex.split(arguments) if not t.startswith("--")]
    return tokens[:-1]


def stages(instructions: List[Tuple[str, str]]) -> List[List[Tuple[str, str]]]:
    """Instructions split at each FROM (each list starts with its FROM)."""
    result: List[List[Tuple[str, str]]] = []
    for keyword, rest in instructions:
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result


def shell_commands(run: str) -> List[str]:
    """The `;`- and `&&`-separated commands of a RUN line, whitespace normalised."""
    return [" ".join(part.split()) for part in re.split(r";|&&", run) if part.strip()]


def expand(text: str, args: Dict[str, str]) -> str:
    """`${NAME}` and `$NAME` replaced by the ARG defaults, as `docker build` does without --build-arg."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def agent_run_commands() -> List[str]:
    instructions = dockerfile(AGENT_DOCKERFILE)
    args = dockerfile_args(AGENT_DOCKERFILE)
    runs = [rest for keyword, rest in instructions if keyword == "RUN"]
    return [expand(command, args) for run in runs for command in shell_commands(run)]


def test_agent_dockerfile_builds_on_the_datadog_charts_agent_release():
    instructions = dockerfile(AGENT_DOCKERFILE)
    keyword, rest = instructions[0]
    assert (keyword, rest.partition("=")[0]) == ("ARG", "AGENT_VERSION")
    assert [rest for keyword, rest in instructions if keyword == "FROM"] == [f"{AGENT_BASE_IMAGE}:${{AGENT_VERSION}}"]
    assert re.fullmatch(r"7\.\d+\.\d+", dockerfile_args(AGENT_DOCKERFILE)["AGENT_VERSION"])
    assert not [rest for keyword, rest in instructions if keyword in ("USER", "ENTRYPOINT", "CMD")]


def test_agent_image_tag_is_the_agent_release_then_ours():
    """Both values files name the image <AGENT_VERSION>-gpumon<version>: the Agent release as
    agents.image.tag (what the Datadog chart parses), our version as agents.image.tagSuffix."""
    agent_version = dockerfile_args(AGENT_DOCKERFILE)["AGENT_VERSION"]
    for path in (DATADOG_VALUES, DATADOG_VALUES_LOCAL):
        image = yaml.safe_load(path.read_text())["agents"]["image"]
        assert image["tag"] == agent_version, path.name
        assert f"{image['tag']}-{image['tagSuffix']}" == f"{agent_version}-gpumon{__about__.__version__}", path.name
    header = AGENT_DOCKERFILE.read_text()
    assert f":{agent_version}-gpumon{__about__.__version__} ." in header


def test_agent_dockerfile_installs_the_wheel_as_a_community_integration():
    copies = [rest for keyword, rest in dockerfile(AGENT_DOCKERFILE) if keyword == "COPY"]
    assert [copy_sources(c) for c in copies] == [["dist/datadog_gpu_monitoring-*.whl"]]

    commands = agent_run_commands()
    (install,) = [c for c in commands if c.startswith("agent integration")]
    # -r: the build runs as root; -w: a local wheel. The Agent then runs pip install --constraint
    # <its constraints> --no-index --no-deps on it and copies datadog_checks/gpu_monitoring/data/
    # to conf.d/gpu_monitoring.d/, which the next checks rely on.
    assert shlex.split(install) == ["agent", "integration", "install", "-r", "-w", "$1"]
    assert "test -f /etc/datadog-agent/conf.d/gpu_monitoring.d/conf.yaml.example" in commands
    assert (ROOT / "datadog_checks" / "gpu_monitoring" / "data" / "conf.yaml.example").is_file()
    # The example config now comes from the wheel, not from a COPY of the repository's copy.
    assert not any("conf.yaml.example" in c for c in copies)


def test_agent_dockerfile_pins_local_modes_packages_through_the_agents_constraints():
    args = dockerfile_args(AGENT_DOCKERFILE)
    commands = agent_run_commands()
    pip_installs = [shlex.split(c) for c in commands if " install " in f" {c} " and "pip" in c.split()[0]]
    (pip_install,) = pip_installs
    assert pip_install[0] == deps.AGENT_PIP
    assert pip_install[1] == "install"
    assert pip_install[pip_install.index("--constraint") + 1] == deps.AGENT_CONSTRAINTS
    assert "--no-cache-dir" in pip_install
    requirements = [token for token in pip_install[2:] if not token.startswith("-") and token != deps.AGENT_CONSTRAINTS]
    # Exactly the pins of gpu_monitoring/__about__.py, by ARG (a --build-arg can move one).
    assert sorted(requirements) == sorted(__about__.DEPS.values())
    assert sorted(value for name, value in args.items() if name != "AGENT_VERSION") == sorted(__about__.DEPS.values())
    # Nothing else is installed into the Agent's Python behind the constraints' back.
    everything = " ".join(commands)
    assert everything.count("pip install") == 1


def test_agent_dockerfile_smoke_test_imports_what_the_agent_loads():
    commands = agent_run_commands()
    # The last step, so that no image is kept in which the check does not import.
    smoke = shlex.split(commands[-1])
    assert smoke[:2] == ["/opt/datadog-agent/embedded/bin/python3", "-c"]
    statement = smoke[2]
    assert statement.startswith("import ")
    imported = {name.strip() for name in statement[len("import "):].split(",")}
    # The name the Agent loads checks by, and the modules of local mode's packages.
    assert imported == {"datadog_checks.gpu_monitoring", *__about__.DEPS}


def test_sidecar_dockerfile():
    instructions = dockerfile(SIDECAR_DOCKERFILE)
    builder, runtime = stages(instructions)
    assert builder[0] == ("FROM", "python:3.12-slim AS builder")
    assert runtime[0] == ("FROM", "python:3.12-slim")

    copied = []
    for keyword, rest in builder:
        if keyword == "COPY":
            for source in copy_sources(rest):
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                copied.append(source)
    # What setup.py packages: both package trees, the README it reads.
    assert {"setup.py", "README.md", "gpu_monitoring", "datadog_checks"} <= set(copied)
    assert any(k == "RUN" and "pip wheel" in rest and "--no-deps" in rest for k, rest in builder)

    assert any(k == "COPY" and rest.startswith("--from=builder ") for k, rest in runtime)
    run = " ".join(rest for keyword, rest in runtime if keyword == "RUN")
    assert "python -m venv /opt/gpu-monitoring" in run
    # The sidecar owns NVML and reads pod-resources: the `sidecar` extra, and no Agent base.
    assert '/opt/gpu-monitoring/bin/pip install --no-cache-dir "$1[sidecar]"' in run
    assert "import pynvml, grpc, importlib.util as u; assert u.find_spec('datadog_checks.base') is None" in run
    assert "useradd" in run and "--uid 10001" in run
    assert any(k == "ENV" and "/opt/gpu-monitoring/bin" in rest for k, rest in runtime)
    assert any(k == "LABEL" and "org.opencontainers.image.title" in rest for k, rest in runtime)
    assert dockerfile_args(SIDECAR_DOCKERFILE)["VERSION"] == __about__.__version__

    (user,) = [rest for keyword, rest in runtime if keyword == "USER"]
    # The image runs unprivileged on its own; the chart runs it as uid 0 (every capability dropped),
    # the owner of the kubelet's pod-resources socket.
    assert user.split(":")[0] == "10001"
    assert chart_values()["podSecurityContext"]["runAsUser"] == 0
    (entrypoint,) = [rest for keyword, rest in runtime if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["gpu-monitoring", "sidecar"]
    # The last instructions: nothing runs as root after USER.
    assert [k for k, _ in runtime[-2:]] == ["USER", "ENTRYPOINT"]


@needs_helm
def test_sidecar_image_entrypoint_is_the_chart_command():
    (entrypoint,) = [rest for keyword, rest in dockerfile(SIDECAR_DOCKERFILE) if keyword == "ENTRYPOINT"]
    assert sidecar_container(daemonset())["command"] == json.loads(entrypoint)
