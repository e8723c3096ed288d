"""Deployment files under deploy/: the sidecar Helm chart, rendered by Helm's own Go engine
(helm-python-sdk, no helm binary, no cluster, no network) and validated against the Kubernetes
JSON schemas (kubernetes-validate); the values files for the Datadog chart; the Dockerfiles; the
systemd unit."""

import json
import posixpath
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import kubernetes_validate
import pytest
import yaml

from gpu_monitoring import config
from gpu_monitoring.sidecar import protocol

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "gpu-monitoring-sidecar"
DATADOG_VALUES = DEPLOY / "helm" / "datadog-values.yaml"
DATADOG_VALUES_LOCAL = DEPLOY / "helm" / "datadog-values-local.yaml"
AGENT_DOCKERFILE = DEPLOY / "docker" / "agent.Dockerfile"
SIDECAR_DOCKERFILE = DEPLOY / "docker" / "sidecar.Dockerfile"
UNIT = DEPLOY / "systemd" / "gpu-monitoring-sidecar.service"

# The dev extra installs helm-python-sdk only where it has wheels for this Python (3.10+).
if sys.version_info >= (3, 10):
    import helm_python as helm
else:  # pragma: no cover
    helm = None
needs_helm = pytest.mark.skipif(helm is None, reason="helm-python-sdk needs Python 3.10+")

# The oldest Kubernetes the chart claims (Chart.yaml kubeVersion) would be 1.25; validate against
# a common production version and the newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
POD_RESOURCES_HOST_DIR = "/var/lib/kubelet/pod-resources"


# --- helpers -------------------------------------------------------------------------------------


def chart_values() -> Dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def chart_socket_path() -> str:
    sidecar = chart_values()["sidecar"]
    return posixpath.join(sidecar["socketDir"], sidecar["socketName"])


def render_raw(values: Optional[Dict[str, Any]] = None) -> Dict[str, str]:
    with helm.Chart.load(CHART) as chart:
        return chart.render(values or {}, name="gpu", namespace="monitoring")


def render(values: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    objects = []
    for path, text in sorted(render_raw(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def daemonset(values: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    (found,) = [obj for obj in render(values) if obj["kind"] == "DaemonSet"]
    return found


def pod_spec(ds: Dict[str, Any]) -> Dict[str, Any]:
    return ds["spec"]["template"]["spec"]


def sidecar_container(ds: Dict[str, Any]) -> Dict[str, Any]:
    (found,) = [c for c in pod_spec(ds)["containers"] if c["name"] == "sidecar"]
    return found


def options(args: List[str]) -> Dict[str, str]:
    """`--name value` pairs of a container's args."""
    pairs = {}
    for i, arg in enumerate(args):
        if arg.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs[arg] = args[i + 1]
    return pairs


def env_of(container: Dict[str, Any]) -> Dict[str, Any]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


def mount_for(ds: Dict[str, Any], container: Dict[str, Any], path: str) -> Tuple[Dict, Dict]:
    """The container's volumeMount holding `path` (deepest first) and its pod volume."""
    mounts = sorted(container["volumeMounts"], key=lambda m: len(m["mountPath"]), reverse=True)
    for mount in mounts:
        root = mount["mountPath"].rstrip("/")
        if path == root or path.startswith(root + "/"):
            (volume,) = [v for v in pod_spec(ds)["volumes"] if v["name"] == mount["name"]]
            return mount, volume
    raise AssertionError(f"{path} is on no volume mount of {container['name']}")


def validate(obj: Dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = "/".join(str(p) for p in error.path)
        pytest.fail(f"{obj['kind']} {obj.get('metadata', {}).get('name')}: {path}: {error.message}")


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


def systemd_unit(path: Path) -> Dict[str, Dict[str, List[str]]]:
    sections: Dict[str, Dict[str, List[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{line!r} is outside any section"
        key, sep, value = line.partition("=")
        assert sep, f"{line!r} is not KEY=VALUE"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def check_instance(values: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    conf = yaml.safe_load(values["datadog"]["confd"]["gpu_monitoring.yaml"])
    assert set(conf) == {"init_config", "instances"}
    assert conf["init_config"] == {}
    (instance,) = conf["instances"]
    return conf, instance


def agent_pod(values: Dict[str, Any]) -> Dict[str, Any]:
    """A Pod carrying what the values add to the Datadog chart's Agent pod, for schema checks."""
    agents = values["agents"]
    container = {
        "name": "agent",
        "image": f"{agents['image']['repository']}:{agents['image']['tag']}",
        "env": agents.get("containers", {}).get("agent", {}).get("env", []),
        "volumeMounts": agents.get("volumeMounts", []),
    }
    spec = {"containers": [container], "volumes": agents.get("volumes", []), "tolerations": agents["tolerations"]}
    if "affinity" in agents:
        spec["affinity"] = agents["affinity"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "datadog-agent"}, "spec": spec}


def values_mount(values: Dict[str, Any], path: str) -> Tuple[Dict, Dict]:
    """The Agent volumeMount holding `path` in a Datadog values file, and its volume."""
    agents = values["agents"]
    for mount in agents["volumeMounts"]:
        root = mount["mountPath"].rstrip("/")
        if path.startswith(root + "/"):
            (volume,) = [v for v in agents["volumes"] if v["name"] == mount["name"]]
            return mount, volume
    raise AssertionError(f"{path} is on no agents.volumeMounts entry")


# --- the sidecar chart, rendered ------------------------------------------------------------------

VALUE_SETS = {
    "defaults": {},
    "no-runtime-class": {"runtimeClassName": ""},
    "custom-uid": {"podSecurityContext": {"runAsUser": 20000, "runAsGroup": 20000}},
    "root": {"podSecurityContext": {"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0}},
    "extras": {
        "extraEnv": [{"name": "GPU_MONITORING_EXTRA", "value": "1"}],
        "extraArgs": ["--log-level", "DEBUG"],
        "priorityClassName": "system-node-critical",
        "podAnnotations": {"example.com/team": "ml"},
        "imagePullSecrets": [{"name": "regcred"}],
        "sidecar": {"simulate": "dgx-h100"},
    },
}


def test_chart_metadata():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "gpu-monitoring-sidecar" == CHART.name
    assert chart["version"] == "0.1.0"
    assert chart["appVersion"] == "0.1.0"
    about: Dict[str, Any] = {}
    exec((ROOT / "gpu_monitoring" / "__about__.py").read_text(), about)
    assert chart["appVersion"] == about["__version__"], "the image tag defaults to appVersion: keep it in step"
    assert (CHART / ".helmignore").is_file()


@needs_helm
def test_chart_loads_and_lints_clean():
    with helm.Chart.load(CHART) as chart:
        assert chart.metadata["name"] == "gpu-monitoring-sidecar"
        assert chart.values["runtimeClassName"] == "nvidia"
    report = helm.lint(CHART, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@needs_helm
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_renders_one_daemonset_and_nothing_else(name):
    # No Service (unix socket only), no ServiceAccount or RBAC (no Kubernetes API access).
    assert [obj["kind"] for obj in render(VALUE_SETS[name])] == ["DaemonSet"]


@needs_helm
@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_manifests_validate_against_kubernetes_schemas(name, version):
    for obj in render(VALUE_SETS[name]):
        validate(obj, version)


@needs_helm
def test_gpu_nodes_only():
    pod = pod_spec(daemonset())
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert GPU_TOLERATION in pod["tolerations"]


@needs_helm
def test_nvidia_runtime_host_pid_and_no_api_access():
    ds = daemonset()
    pod = pod_spec(ds)
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["hostPID"] is True
    assert pod["automountServiceAccountToken"] is False
    env = env_of(sidecar_container(ds))
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    # The sidecar must not take a GPU away from workloads.
    assert "nvidia.com/gpu" not in json.dumps(sidecar_container(ds)["resources"])


@needs_helm
def test_runs_non_root_with_nothing_extra():
    ds = daemonset()
    pod_security = pod_spec(ds)["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] == 10001
    assert pod_security["runAsGroup"] == 10001
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    security = sidecar_container(ds)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security.get("privileged") is not True


@needs_helm
def test_resources_requests_and_limits():
    resources = sidecar_container(daemonset())["resources"]
    assert resources["requests"] == {"cpu": "50m", "memory": "64Mi"}
    assert resources["limits"]["memory"] == "256Mi"


@needs_helm
def test_host_directories():
    ds = daemonset()
    volumes = {v["name"]: v for v in pod_spec(ds)["volumes"]}
    mounts = {m["mountPath"]: m for m in sidecar_container(ds)["volumeMounts"]}

    pod_resources = mounts[POD_RESOURCES_HOST_DIR]
    assert pod_resources["readOnly"] is True
    assert volumes[pod_resources["name"]]["hostPath"]["path"] == POD_RESOURCES_HOST_DIR

    for path in ("/var/run/gpu-monitoring", "/var/lib/gpu-monitoring"):
        mount = mounts[path]
        assert not mount.get("readOnly")
        assert volumes[mount["name"]]["hostPath"] == {"path": path, "type": "DirectoryOrCreate"}


@needs_helm
def test_command_and_paths_match_the_mounts():
    ds = daemonset()
    container = sidecar_container(ds)
    assert container["command"] == ["gpu-monitoring", "sidecar"]
    args = options(container["args"])

    socket = args["--socket"]
    assert socket == chart_socket_path() == "/var/run/gpu-monitoring/sidecar.sock"
    mount, volume = mount_for(ds, container, socket)
    # Same path on the host as in the container, so the Agent mounting the host directory at that
    # path finds the socket where its sidecar_socket says.
    assert mount["mountPath"] == posixpath.dirname(socket) == volume["hostPath"]["path"]
    assert not mount.get("readOnly")

    mount, volume = mount_for(ds, container, args["--journal"])
    assert volume["hostPath"]["path"] == "/var/lib/gpu-monitoring"
    assert args["--journal"] == "/var/lib/gpu-monitoring/journal"
    assert not mount.get("readOnly")

    assert args["--pod-resources-socket"] == POD_RESOURCES_HOST_DIR + "/kubelet.sock"
    mount, volume = mount_for(ds, container, args["--pod-resources-socket"])
    assert mount["readOnly"] is True and volume["hostPath"]["path"] == POD_RESOURCES_HOST_DIR

    assert args["--proc-root"] == "/proc"  # the host's, through hostPID
    assert "--simulate" not in args


@needs_helm
def test_probes_run_healthz_on_the_served_socket():
    container = sidecar_container(daemonset())
    socket = options(container["args"])["--socket"]
    for probe in ("livenessProbe", "readinessProbe"):
        spec = container[probe]
        assert spec["exec"]["command"] == ["gpu-monitoring", "healthz", "--socket", socket]
        assert "httpGet" not in spec and "tcpSocket" not in spec
        assert spec["timeoutSeconds"] >= 5


@needs_helm
def test_rolling_update():
    assert daemonset()["spec"]["updateStrategy"]["type"] == "RollingUpdate"


@needs_helm
def test_init_container_hands_host_directories_to_the_user():
    ds = daemonset()
    (init,) = pod_spec(ds)["initContainers"]
    assert init["image"] == sidecar_container(ds)["image"]
    assert init["securityContext"]["runAsUser"] == 0
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    env = env_of(init)
    assert env["OWNER"] == "10001:10001"
    assert env["SOCKET_DIR"] == "/var/run/gpu-monitoring"
    assert env["JOURNAL_DIR"] == "/var/lib/gpu-monitoring/journal"
    assert {m["mountPath"] for m in init["volumeMounts"]} == {"/var/run/gpu-monitoring", "/var/lib/gpu-monitoring"}


@needs_helm
def test_empty_runtime_class_is_left_out():
    assert "runtimeClassName" not in pod_spec(daemonset({"runtimeClassName": ""}))


@needs_helm
def test_custom_uid():
    ds = daemonset(VALUE_SETS["custom-uid"])
    security = pod_spec(ds)["securityContext"]
    assert (security["runAsNonRoot"], security["runAsUser"], security["runAsGroup"]) == (True, 20000, 20000)
    (init,) = pod_spec(ds)["initContainers"]
    assert env_of(init)["OWNER"] == "20000:20000"


@needs_helm
def test_root_override_drops_the_init_container_but_no_other_protection():
    ds = daemonset(VALUE_SETS["root"])
    pod = pod_spec(ds)
    assert pod["securityContext"]["runAsUser"] == 0
    assert pod["securityContext"]["runAsNonRoot"] is False
    assert "initContainers" not in pod
    security = sidecar_container(ds)["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True


@needs_helm
def test_extra_env_args_and_optional_fields():
    ds = daemonset(VALUE_SETS["extras"])
    pod = pod_spec(ds)
    container = sidecar_container(ds)
    env = env_of(container)
    assert env["GPU_MONITORING_EXTRA"] == "1"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert container["args"][-2:] == ["--log-level", "DEBUG"]
    assert options(container["args"])["--simulate"] == "dgx-h100"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert ds["spec"]["template"]["metadata"]["annotations"] == {"example.com/team": "ml"}

    default_pod = pod_spec(daemonset())
    assert "priorityClassName" not in default_pod
    assert "imagePullSecrets" not in default_pod


@needs_helm
def test_moved_socket_moves_everything_with_it():
    ds = daemonset({"sidecar": {"socketDir": "/run/gpu-mon/", "socketName": "s.sock"}})
    container = sidecar_container(ds)
    socket = options(container["args"])["--socket"]
    assert socket == "/run/gpu-mon/s.sock"
    assert container["livenessProbe"]["exec"]["command"][-1] == socket
    mount, volume = mount_for(ds, container, socket)
    assert mount["mountPath"] == volume["hostPath"]["path"] == "/run/gpu-mon"


@needs_helm
def test_image_defaults_to_app_version():
    container = sidecar_container(daemonset())
    assert container["image"] == "registry.example.com/gpu-monitoring-sidecar:0.1.0"
    assert container["image"].rsplit(":", 1)[1] == yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    image = {"repository": "r.example/s", "tag": "dev", "pullPolicy": "Always"}
    tagged = sidecar_container(daemonset({"image": image}))
    assert (tagged["image"], tagged["imagePullPolicy"]) == ("r.example/s:dev", "Always")


@needs_helm
def test_notes_name_the_socket():
    notes = render_raw()["gpu-monitoring-sidecar/templates/NOTES.txt"]
    assert f"sidecar_socket: {chart_socket_path()}" in notes


# --- the Datadog chart's values ------------------------------------------------------------------


def test_datadog_values_sidecar_mode():
    values = yaml.safe_load(DATADOG_VALUES.read_text())
    _, instance = check_instance(values)
    assert instance["source"] == "sidecar"
    assert instance["sidecar_socket"] == chart_socket_path()
    assert instance["ignore_missing_sidecar"] is True
    assert instance["min_collection_interval"] == 15
    assert instance["hourly_price"] and all(
        isinstance(k, str) and isinstance(v, (int, float)) for k, v in instance["hourly_price"].items()
    )

    image = values["agents"]["image"]
    assert image["repository"] and isinstance(image["tag"], str) and image["tag"]
    assert image["doNotCheckTag"] is True

    # The host socket directory, mounted at the same path as in the sidecar.
    mount, volume = values_mount(values, instance["sidecar_socket"])
    assert mount["mountPath"] == posixpath.dirname(instance["sidecar_socket"])
    assert volume["hostPath"]["path"] == mount["mountPath"]
    assert mount["readOnly"] is True

    assert GPU_TOLERATION in values["agents"]["tolerations"]
    # Sidecar mode keeps the Agent pod off the NVIDIA runtime.
    assert "gpuMonitoring" not in values["datadog"]


def test_datadog_values_local_mode():
    values = yaml.safe_load(DATADOG_VALUES_LOCAL.read_text())
    _, instance = check_instance(values)
    assert instance["source"] == "local"
    assert instance["kubernetes"] is True
    assert instance["proc_root"] == "/host/proc"
    assert "sidecar_socket" not in instance

    mount, volume = values_mount(values, instance["pod_resources_socket"])
    assert volume["hostPath"]["path"] == POD_RESOURCES_HOST_DIR
    assert mount["readOnly"] is True
    assert instance["pod_resources_socket"] == mount["mountPath"] + "/kubelet.sock"

    gpu = values["datadog"]["gpuMonitoring"]
    assert gpu["enabled"] is True and gpu["runtimeClassName"] == "nvidia"
    env = {e["name"]: e["value"] for e in values["agents"]["containers"]["agent"]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"

    image = values["agents"]["image"]
    assert image["repository"] and image["tag"] and image["doNotCheckTag"] is True
    assert GPU_TOLERATION in values["agents"]["tolerations"]
    (term,) = values["agents"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]} in term["matchExpressions"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", [DATADOG_VALUES, DATADOG_VALUES_LOCAL], ids=lambda p: p.name)
def test_datadog_values_fragments_are_valid_pod_fields(path, version):
    validate(agent_pod(yaml.safe_load(path.read_text())), version)


@pytest.mark.parametrize("path", [DATADOG_VALUES, DATADOG_VALUES_LOCAL], ids=lambda p: p.name)
def test_the_check_reads_every_option_as_written(path):
    """The check's own parser takes each option (a misspelt one would come back as its default)."""
    _, instance = check_instance(yaml.safe_load(path.read_text()))
    parsed = config.parse(instance)
    for name, value in instance.items():
        if name == "min_collection_interval":  # the Agent's, not the check's
            continue
        expected = {True: "true", False: "false"}.get(value, value) if name == "kubernetes" else value
        assert getattr(parsed, name) == expected, name


def test_paths_are_the_products_defaults():
    assert chart_socket_path() == protocol.DEFAULT_SOCKET
    assert posixpath.join(chart_values()["sidecar"]["stateDir"], "journal") == protocol.DEFAULT_JOURNAL
    assert POD_RESOURCES_HOST_DIR + "/kubelet.sock" == config.DEFAULT_POD_RESOURCES_SOCKET


def test_both_modes_use_the_same_agent_image():
    sidecar = yaml.safe_load(DATADOG_VALUES.read_text())["agents"]["image"]
    local = yaml.safe_load(DATADOG_VALUES_LOCAL.read_text())["agents"]["image"]
    assert sidecar == local


# --- Dockerfiles ---------------------------------------------------------------------------------


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


# --- systemd unit --------------------------------------------------------------------------------


def test_systemd_unit():
    unit = systemd_unit(UNIT)
    service = {key: values[-1] for key, values in unit["Service"].items()}

    argv = shlex.split(service["ExecStart"])
    assert argv[:2] == ["/opt/gpu-monitoring/bin/gpu-monitoring", "sidecar"]
    args = options(argv)
    assert args["--socket"] == chart_socket_path()
    assert args["--socket"] == "/var/run/gpu-monitoring/sidecar.sock"
    # The socket lives in the RuntimeDirectory (/run = /var/run), the journal in the StateDirectory.
    assert service["RuntimeDirectory"] == "gpu-monitoring"
    assert posixpath.dirname(args["--socket"]) == "/var/run/" + service["RuntimeDirectory"]
    assert service["StateDirectory"] == "gpu-monitoring"
    assert args["--journal"].startswith("/var/lib/" + service["StateDirectory"] + "/")

    assert service["User"] == "gpu-monitoring"
    assert service["Group"] == "dd-agent"
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert service["ProtectHome"] == "yes"
    assert service["PrivateTmp"] == "yes"
    # NVML needs /dev/nvidia*: nothing that hides or filters devices.
    assert service.get("PrivateDevices", "no") in ("no", "false", "0")
    for key in ("DevicePolicy", "DeviceAllow", "ProtectClock"):
        assert key not in service, key
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_readme_installs_what_the_unit_runs():
    readme = (DEPLOY / "systemd" / "README.md").read_text()
    unit = systemd_unit(UNIT)
    assert "python3 -m venv /opt/gpu-monitoring" in readme
    assert "useradd" in readme and unit["Service"]["User"][-1] in readme
    assert f"systemctl enable --now {UNIT.stem}" in readme
    assert "source: sidecar" in readme and f"sidecar_socket: {chart_socket_path()}" in readme
