"""The sidecar Helm chart in deploy/helm/gpu-monitoring-sidecar, rendered by Helm's own Go engine
(helm-python-sdk, no helm binary, no cluster, no network) and validated against the Kubernetes
JSON schemas (kubernetes-validate)."""

import json
import posixpath
import re
from typing import Any, Dict, Tuple

import pytest
import yaml

from .deploy_support import (
    CHART,
    GPU_TOLERATION,
    K8S_VERSIONS,
    POD_RESOURCES_HOST_DIR,
    ROOT,
    SYSFS_READS,
    chart_socket_path,
    chart_values,
    daemonset,
    helm,
    needs_helm,
    options,
    pod_spec,
    render,
    render_raw,
    sidecar_container,
    validate,
)


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


VALUE_SETS = {
    "defaults": {},
    "no-runtime-class": {"runtimeClassName": ""},
    "non-root": {"podSecurityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001}},
    "custom-uid": {"podSecurityContext": {"runAsNonRoot": True, "runAsUser": 20000, "runAsGroup": 20000}},
    "extras": {
        "extraEnv": [{"name": "GPU_MONITORING_EXTRA", "value": "1"}],
        "extraArgs": ["--log-level", "DEBUG"],
        "priorityClassName": "system-node-critical",
        "podAnnotations": {"example.com/team": "ml"},
        "imagePullSecrets": [{"name": "regcred"}],
        "sidecar": {"simulate": "dgx-h100"},
    },
    "no-kernel-log": {"kernelLog": {"enabled": False}},
    # GKE: the host's driver directory, and the library in it.
    "gke": {
        "runtimeClassName": "",
        "extraVolumes": [{"name": "nvidia", "hostPath": {"path": "/home/kubernetes/bin/nvidia"}}],
        "extraVolumeMounts": [{"name": "nvidia", "mountPath": "/usr/local/nvidia", "readOnly": True}],
        "extraArgs": ["--nvml-library-path", "/usr/local/nvidia/lib64/libnvidia-ml.so.1"],
    },
}


def test_chart_metadata():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "gpu-monitoring-sidecar" == CHART.name
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
def test_runs_as_uid_0_with_every_capability_dropped_but_syslog():
    # uid 0 reads pod-resources (the kubelet's socket is root's; connecting needs write permission on
    # it) and needs no capability to; SYSLOG opens /dev/kmsg where kernel.dmesg_restrict is 1. The
    # default render holds nothing else.
    pod = pod_spec(daemonset())
    pod_security = pod["securityContext"]
    assert (pod_security["runAsUser"], pod_security["runAsGroup"], pod_security["runAsNonRoot"]) == (0, 0, False)
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        security = container["securityContext"]
        assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
        assert security.get("privileged") is not True
        assert security.get("runAsUser", 0) == 0
    # Directories the kubelet creates root-owned are already root's: nothing to hand over.
    assert "initContainers" not in pod


MIB = {"Mi": 1, "Gi": 1024}


@needs_helm
def test_resources_requests_and_limits():
    resources = sidecar_container(daemonset())["resources"]
    assert resources["requests"]["cpu"] == "50m"
    # The request is what the bench measured the sidecar at, with headroom: a scheduler that trusts
    # a smaller one packs the node until the sidecar is the pod the kernel kills.
    measured = json.loads((ROOT / "docs" / "performance.json").read_text())["headline"]["sidecar_rss_mib"]
    requested, limit = (_mib(resources[kind]["memory"]) for kind in ("requests", "limits"))
    assert 1.4 * measured <= requested <= 2 * measured, (measured, requested)
    assert limit >= 4 * requested


def _mib(quantity: str) -> float:
    return float(quantity[:-2]) * MIB[quantity[-2:]]


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

    # The host's sysfs, read-only, submounts included where the runtime can; recursiveReadOnly
    # refuses any mount propagation but None.
    sysfs = mounts[chart_values()["sidecar"]["sysfsRoot"]]
    assert sysfs["mountPath"] == "/host/sys"
    assert sysfs["readOnly"] is True and sysfs["recursiveReadOnly"] == "IfPossible"
    assert "mountPropagation" not in sysfs
    assert volumes[sysfs["name"]]["hostPath"] == {"path": "/sys", "type": "Directory"}

    # The host's kernel log, the device itself, read-only where the sidecar opens it.
    kmsg = mounts["/dev/kmsg"]
    assert kmsg["readOnly"] is True
    assert volumes[kmsg["name"]]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}


@needs_helm
def test_the_sidecar_writes_only_its_socket_and_state_directories_on_the_host():
    ds = daemonset()
    volumes = {v["name"]: v for v in pod_spec(ds)["volumes"]}
    writable = [
        volumes[m["name"]]["hostPath"]["path"]
        for m in sidecar_container(ds)["volumeMounts"]
        if "hostPath" in volumes[m["name"]] and not m.get("readOnly")
    ]
    assert sorted(writable) == ["/var/lib/gpu-monitoring", "/var/run/gpu-monitoring"]


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

    # auto: /dev/kmsg, the host's, mounted where the sidecar opens it.
    assert args["--kernel-log"] == "auto"
    mount, volume = mount_for(ds, container, "/dev/kmsg")
    assert mount["mountPath"] == "/dev/kmsg" == volume["hostPath"]["path"] and mount["readOnly"] is True

    # What the sidecar reads below --sysfs-root is on the host's /sys.
    assert args["--sysfs-root"] == "/host/sys"
    for directory in SYSFS_READS:
        mount, volume = mount_for(ds, container, posixpath.join(args["--sysfs-root"], *directory))
        assert mount["mountPath"] == args["--sysfs-root"]
        assert mount["readOnly"] is True and volume["hostPath"]["path"] == "/sys"


@needs_helm
def test_probes_run_healthz_on_the_served_socket():
    container = sidecar_container(daemonset())
    socket = options(container["args"])["--socket"]
    # Liveness asks only that it answers: a sidecar whose journal fails holds events a restart would lose.
    for probe, flags in (("livenessProbe", ["--live"]), ("readinessProbe", [])):
        spec = container[probe]
        assert spec["exec"]["command"] == ["gpu-monitoring", "healthz", *flags, "--socket", socket]
        assert "httpGet" not in spec and "tcpSocket" not in spec
        assert spec["timeoutSeconds"] >= 5


@needs_helm
def test_rolling_update():
    assert daemonset()["spec"]["updateStrategy"]["type"] == "RollingUpdate"


def kmsg_mounts(ds: Dict[str, Any]) -> list:
    """The sidecar's mounts of /dev/kmsg, and the pod's volumes of it."""
    volumes = [v for v in pod_spec(ds)["volumes"] if v.get("hostPath", {}).get("path") == "/dev/kmsg"]
    mounts = [m for m in sidecar_container(ds)["volumeMounts"] if m["mountPath"] == "/dev/kmsg"]
    return mounts + volumes


@needs_helm
def test_the_kernel_log_is_the_hosts_kmsg_read_only_with_syslog_the_only_capability_added():
    assert chart_values()["kernelLog"] == {"enabled": True}
    ds = daemonset()
    mount, volume = kmsg_mounts(ds)
    assert mount == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    assert volume == {"name": "kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}}
    security = sidecar_container(ds)["securityContext"]
    assert security["capabilities"]["add"] == ["SYSLOG"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security.get("privileged") is not True and security["allowPrivilegeEscalation"] is False
    # Added to the capabilities of one's own, once.
    own = {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE", "SYSLOG"]}}}
    assert sidecar_container(daemonset(own))["securityContext"]["capabilities"] == {
        "drop": ["ALL"], "add": ["SYS_PTRACE", "SYSLOG"]}
    # The values themselves are left as they are, for the init container among others.
    (init,) = pod_spec(daemonset(VALUE_SETS["non-root"]))["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}


@needs_helm
def test_the_kernel_log_switched_off_mounts_nothing_adds_nothing_and_passes_none():
    ds = daemonset(VALUE_SETS["no-kernel-log"])
    assert kmsg_mounts(ds) == []
    container = sidecar_container(ds)
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert options(container["args"])["--kernel-log"] == "none"
    # Everything else renders as it does with the log on.
    on = sidecar_container(daemonset())
    assert [m for m in on["volumeMounts"] if m["mountPath"] != "/dev/kmsg"] == container["volumeMounts"]


@needs_helm
def test_a_simulated_node_reads_its_own_kernel_log():
    # With --simulate and no --kernel-log the simulated node's log stands in; off still passes none.
    args = options(sidecar_container(daemonset({"sidecar": {"simulate": "faults"}}))["args"])
    assert args["--simulate"] == "faults" and "--kernel-log" not in args
    off = {"sidecar": {"simulate": "faults"}, "kernelLog": {"enabled": False}}
    assert options(sidecar_container(daemonset(off))["args"])["--kernel-log"] == "none"


@needs_helm
def test_a_non_root_user_gets_the_host_directories_from_an_init_container():
    ds = daemonset(VALUE_SETS["non-root"])
    assert pod_spec(ds)["securityContext"]["runAsNonRoot"] is True
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
    # The sidecar itself keeps every other protection.
    security = sidecar_container(ds)["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert security["readOnlyRootFilesystem"] is True


@needs_helm
def test_non_root_without_the_init_container():
    values = dict(VALUE_SETS["non-root"], initDirectories={"enabled": False})
    assert "initContainers" not in pod_spec(daemonset(values))


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


def test_gke_mounts_the_hosts_driver_and_loads_its_library():
    ds = daemonset(VALUE_SETS["gke"])
    container = sidecar_container(ds)
    library = options(container["args"])["--nvml-library-path"]
    mount, volume = mount_for(ds, container, library)
    assert mount["readOnly"] and volume["hostPath"]["path"] == "/home/kubernetes/bin/nvidia"
    assert "runtimeClassName" not in pod_spec(ds)


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
def test_moved_sysfs_root_moves_the_mount_with_it():
    ds = daemonset({"sidecar": {"sysfsRoot": "/hostfs/sys/"}})
    container = sidecar_container(ds)
    assert options(container["args"])["--sysfs-root"] == "/hostfs/sys"
    mount, volume = mount_for(ds, container, "/hostfs/sys/class/infiniband")
    assert mount["mountPath"] == "/hostfs/sys" and volume["hostPath"]["path"] == "/sys"


@needs_helm
def test_an_empty_sysfs_root_is_refused():
    with pytest.raises(helm.HelmRenderError, match="sidecar.sysfsRoot"):
        render({"sidecar": {"sysfsRoot": ""}})


@needs_helm
@pytest.mark.parametrize(
    "kube_version,schema,recursive",
    [("v1.25.0", "1.25", False), ("v1.29.9", "1.29", False), ("v1.30.0", "1.30", True), ("v1.33.1", "1.33", True)],
)
def test_the_host_sysfs_is_recursively_read_only_where_the_cluster_has_the_field(kube_version, schema, recursive):
    # recursiveReadOnly came with Kubernetes 1.30; the API of an older cluster refuses the field.
    ds = daemonset(kube_version=kube_version)
    mount, _ = mount_for(ds, sidecar_container(ds), "/host/sys/bus/pci/devices")
    assert mount["readOnly"] is True
    assert mount.get("recursiveReadOnly") == ("IfPossible" if recursive else None)
    validate(ds, schema)


@needs_helm
def test_image_defaults_to_app_version():
    container = sidecar_container(daemonset())
    assert container["image"].startswith("registry.example.com/gpu-monitoring-sidecar:")
    assert container["image"].rsplit(":", 1)[1] == yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    image = {"repository": "r.example/s", "tag": "dev", "pullPolicy": "Always"}
    tagged = sidecar_container(daemonset({"image": image}))
    assert (tagged["image"], tagged["imagePullPolicy"]) == ("r.example/s:dev", "Always")


@needs_helm
def test_notes_name_the_socket():
    notes = render_raw()["gpu-monitoring-sidecar/templates/NOTES.txt"]
    assert f"sidecar_socket: {chart_socket_path()}" in notes


@needs_helm
def test_notes_warn_that_a_non_root_install_cannot_read_pod_resources():
    assert "pod-resources socket" not in render_raw()["gpu-monitoring-sidecar/templates/NOTES.txt"]
    notes = render_raw(VALUE_SETS["non-root"])["gpu-monitoring-sidecar/templates/NOTES.txt"]
    assert "runs as uid 10001, not 0" in notes and "gpu_monitoring.kubelet.can_connect is WARNING" in notes


@needs_helm
def test_every_privilege_of_the_default_render_is_justified_in_the_chart_readme():
    readme = (CHART / "README.md").read_text()
    spec = pod_spec(daemonset())
    granted = [f"runtimeClassName: {spec['runtimeClassName']}"]
    if spec.get("hostPID"):
        granted.append("hostPID: true")
    granted += [f"hostPath `{v['hostPath']['path']}`" for v in spec["volumes"] if "hostPath" in v]
    env = {e["name"]: e.get("value") for e in sidecar_container(daemonset())["env"]}
    granted.append(f"NVIDIA_VISIBLE_DEVICES={env['NVIDIA_VISIBLE_DEVICES']}")
    if spec["securityContext"].get("runAsUser") == 0:
        granted.append("runAsUser: 0")
    for container in spec.get("initContainers", []) + spec["containers"]:
        context = container.get("securityContext", {})
        if context.get("runAsUser") == 0:
            granted += [f"`{container['name']}`", "runAsUser: 0"]
        granted += context.get("capabilities", {}).get("add", [])
    missing = [privilege for privilege in granted if privilege not in readme]
    assert not missing, f"deploy/helm/gpu-monitoring-sidecar/README.md does not justify: {missing}"


def said(text: str) -> str:
    """Prose of a Markdown file or of YAML comments, as one line: comment markers and wrapping dropped."""
    return " ".join(re.sub(r"^\s*#( -- )?", "", line) for line in text.splitlines()).replace("**", "")


# The readiness and liveness rule, as `gpu-monitoring healthz --help` and GET /healthz apply it.
PROBE_RULE = (
    "Readiness (`healthz`) fails while NVML cannot be read at all (the library missing, initialisation failing, "
    "or not a single GPU readable) or the journal cannot be written",
    "Liveness (`healthz --live`) fails only when the sidecar does not answer.",
)


def test_the_readmes_and_values_state_the_same_probe_rule():
    for path in (CHART / "README.md", CHART / "values.yaml", ROOT / "README.md"):
        text = " ".join(said(path.read_text()).split())
        for sentence in PROBE_RULE:
            assert sentence in text, f"{path.name} does not say: {sentence}"


def test_values_say_how_gpu_nodes_are_selected():
    text = " ".join(said((CHART / "values.yaml").read_text()).split())
    (label,) = chart_values()["nodeSelector"]
    assert label == "nvidia.com/gpu.present" and "GPU feature discovery" in text
    assert f"kubectl label node <node> {label}=true" in text
