"""The Dockerfiles in deploy/docker: the Agent image, with the check installed into the Agent's
embedded Python, and the sidecar image, non-root, whose entrypoint is the Helm chart's command."""

import json
import shlex
from pathlib import Path
from typing import List, Tuple

from .deploy_support import DEPLOY, ROOT, chart_values, daemonset, needs_helm, sidecar_container

AGENT_DOCKERFILE = DEPLOY / "docker" / "agent.Dockerfile"
SIDECAR_DOCKERFILE = DEPLOY / "docker" / "sidecar.Dockerfile"


def dockerfile(path: Path) -> List[Tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    instructions = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, f"{path.name} ends inside a continued line"
    return instructions


def stages(instructions: List[Tuple[str, str]]) -> List[List[Tuple[str, str]]]:
    """Instructions split at each FROM (each list starts with its FROM)."""
    result: List[List[Tuple[str, str]]] = []
    for keyword, rest in instructions:
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result


def copy_sources(arguments: str) -> List[str]:
    tokens = [t for t in shlex.split(arguments) if not t.startswith("--")]
    return tokens[:-1]


def test_agent_dockerfile():
    instructions = dockerfile(AGENT_DOCKERFILE)
    assert instructions[0] == ("ARG", "AGENT_VERSION=7")
    assert [rest for keyword, rest in instructions if keyword == "FROM"] == ["gcr.io/datadoghq/agent:${AGENT_VERSION}"]

    copies = [rest for keyword, rest in instructions if keyword == "COPY"]
    assert any(copy_sources(c) == ["dist/datadog_gpu_monitoring-*.whl"] for c in copies)
    assert "conf.yaml.example /etc/datadog-agent/conf.d/gpu_monitoring.d/conf.yaml.example" in copies
    for copy in copies:
        for source in copy_sources(copy):
            if not source.startswith("dist/"):  # dist/ is built before docker build
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"

    run = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    assert "/opt/datadog-agent/embedded/bin/pip install --no-cache-dir --no-deps" in run
    assert "nvidia-ml-py" in run and "grpcio" in run
    # Every install goes into the Agent's embedded Python.
    assert run.count("pip install") == run.count("/opt/datadog-agent/embedded/bin/pip install") == 2
    assert not [rest for keyword, rest in instructions if keyword in ("USER", "ENTRYPOINT", "CMD")]


def test_sidecar_dockerfile():
    instructions = dockerfile(SIDECAR_DOCKERFILE)
    builder, runtime = stages(instructions)
    assert builder[0] == ("FROM", "python:3.12-slim AS builder")
    assert runtime[0] == ("FROM", "python:3.12-slim")

    for keyword, rest in builder:
        if keyword == "COPY":
            for source in copy_sources(rest):
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    assert any(k == "RUN" and "pip wheel" in rest and "--no-deps" in rest for k, rest in builder)

    assert any(k == "COPY" and rest.startswith("--from=builder ") for k, rest in runtime)
    run = " ".join(rest for keyword, rest in runtime if keyword == "RUN")
    assert "python -m venv /opt/gpu-monitoring" in run
    assert "useradd" in run and "--uid 10001" in run
    assert any(k == "ENV" and "/opt/gpu-monitoring/bin" in rest for k, rest in runtime)
    assert any(k == "LABEL" and "org.opencontainers.image.title" in rest for k, rest in runtime)

    (user,) = [rest for keyword, rest in runtime if keyword == "USER"]
    assert user.split(":")[0] == "10001" == str(chart_values()["podSecurityContext"]["runAsUser"])
    (entrypoint,) = [rest for keyword, rest in runtime if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["gpu-monitoring", "sidecar"]
    # The last instructions: nothing runs as root after USER.
    assert [k for k, _ in runtime[-2:]] == ["USER", "ENTRYPOINT"]


@needs_helm
def test_sidecar_image_entrypoint_is_the_chart_command():
    (entrypoint,) = [rest for keyword, rest in dockerfile(SIDECAR_DOCKERFILE) if keyword == "ENTRYPOINT"]
    assert sidecar_container(daemonset())["command"] == json.loads(entrypoint)
