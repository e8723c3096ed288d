"""Property-based fuzzing of every parser of input from outside the sidecar: configuration, cgroup
lines, device IDs, the kubelet's pod list and pod-resources messages. Each gets arbitrary input and
mutated good input; the only way out is a result or the error the parser documents, and good input
reads back as it was written. Budget and strategies: fuzz_support.py."""

import dataclasses
import json
import math
import re
import string
from pathlib import Path

import yaml
from datadog_checks.base import ConfigurationError
from hypothesis import event, given
from hypothesis import strategies as st

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.config_models.instance import InstanceConfig as InstanceModel
from gpu_monitoring.kube.cdi_devices import GPU_DRIVER
from gpu_monitoring.kube.device_ids import DeviceRef, parse_device_id
from gpu_monitoring.kube.pod_list import PodInfo, parse_pod_list
from gpu_monitoring.kube.pod_list_reader import PodListReader
from gpu_monitoring.kube.pod_resources import PodResourcesError, decode_allocatable, decode_allocations
from gpu_monitoring.node.procfs import ProcessOwner, parse_cgroup
from gpu_monitoring.snapshot import Advertised, Allocation, SlurmJob

from ..config_support import derived, validated
from .fuzz_support import (
    CHECK_EXAMPLES,
    JSON,
    PARSER_EXAMPLES,
    TEXT,
    fuzz,
    mutated,
)

# --- configuration --------------------------------------------------------------------------

SPEC = Path(__file__).resolve().parents[2] / "assets" / "configuration" / "spec.yaml"


def _spec_options():
    spec = yaml.safe_load(SPEC.read_text())
    names = set()
    for file in spec["files"]:
        for section in file["options"]:
            names.update(option["name"] for option in section.get("options", []) if "name" in option)
    # The Agent's own instance options (the `instances/default` template) reach parse() as well.
    return sorted(names | set(InstanceModel.model_fields))


OPTIONS = _spec_options()
# A good value for every option, so that an instance with one or two wrong ones reaches their checks.
GOOD = {
    "source": ["local", "sidecar"], "sidecar_socket": ["/var/run/gpu-monitoring/sidecar.sock"],
    "ignore_missing_sidecar": [True, False], "nvml_library_path": ["/usr/lib/libnvidia-ml.so.1"],
    "simulate": ["dgx-h100"], "collect_processes": [True, False], "disabled_collectors": [[], ["memory", "gpm"]],
    "xid_ignore": [[], [13, 31]], "temperature_margin": [0, 5, 2.5, 100],
    "fabric_registration_grace": [0, 300, 86400], "max_processes_per_device": [0, 64],
    "proc_root": ["/proc", "/host/proc"], "kubernetes": ["auto", "true", "false", True, False],
    "kubelet_url": ["https://10.0.0.1:10250", "http://[::1]:10255/pods"], "kubelet_token_path": ["/var/token"],
    "kubelet_ca_path": ["/var/ca.crt"], "kubelet_tls_verify": [True, False], "kubelet_timeout": [0.5, 5, 60],
    "pod_cache_ttl": [0, 30], "pod_resources_socket": ["/var/lib/kubelet/pod-resources/kubelet.sock"],
    "gpu_resource_names": [["nvidia.com/gpu", "nvidia.com/mig-*"]],
    "dcgm_exporter_url": ["auto", "none", "http://10.244.3.17:9400/metrics"],
    "hourly_price": [{}, {"NVIDIA H100*": 4.5}],
    "default_hourly_price": [0, 2.5], "effective_threshold": [0, 50, 100], "tags": [[], ["team:ml"]],
    "service": ["gpu"], "min_collection_interval": [15, 0.5], "empty_default_hostname": [False],
    "disable_generic_tags": [True], "enable_legacy_tags_normalization": [True],
    "metric_patterns": [{"include": ["gpu_monitoring.*"]}], "metrics_profile": ["essential", "standard", "full"],
    "name": ["gpu-node"], "namespace": ["default"], "no_index": [False], "loader": ["python"],
    "process_isolation": [False], "sysfs_root": ["/sys", "/host/sys"], "expected_gpus": [1, 8],
    "kernel_log": ["auto", "none", "/var/log/kern.log"],
    "expected_network_ports": ["auto", 0, 8], "expected_network_rate": ["auto", 400, 200.5],
    "network_ports_exclude": [[], ["mlx5_4", "eth*"]], "fault_hold": [0, 86400],
}
assert set(GOOD) >= set(OPTIONS), sorted(set(OPTIONS) - set(GOOD))
# Values an operator might really write wrongly: edges of every range and type, beside arbitrary JSON.
WRONG = st.sampled_from([
    "local", "sidecar", "auto", "true", "false", True, False, 0, 1, 5, 15, 60, 61, -1, 0.5, 1e9, 1e10,
    "dgx-h100", "https://10.0.0.1:10250", "http://[::1]:10250/pods", "https://host:99999", "http://[",
    "https://host:0", "ftp://host", "https://", "/var/run/gpu-monitoring/sidecar.sock", "/tmp/" + "x" * 120, "/proc",
    "", " ", "a\0b", "\ud800", "/tmp/\udcff", ["utilization", "memory"], ["nope"], [79, 48], [0], [True], ["env:prod"],
    [""], {"NVIDIA H100*": 4.5}, {"": 1}, {"a": math.nan}, {"a": -1}, {"a": True}, {"a": 10**400},
]) | JSON


@st.composite
def instances(draw):
    names = draw(st.lists(st.sampled_from(OPTIONS), unique=True, max_size=12))
    instance = {name: draw(st.sampled_from(GOOD[name])) for name in names}
    for name in draw(st.lists(st.sampled_from(OPTIONS), unique=True, max_size=3)):
        instance[name] = draw(WRONG)
    return instance


INSTANCES = instances()


@fuzz(PARSER_EXAMPLES)
@given(INSTANCES)
def test_config_parse_returns_or_raises_configuration_error(instance):
    try:
        parsed = validated(instance)
        kubernetes = derived(instance).kubernetes
    except ConfigurationError as error:
        assert str(error)
        event("refused")
        return
    event("accepted")
    for value in (parsed.temperature_margin, parsed.effective_threshold, *parsed.hourly_price.values()):
        assert math.isfinite(value)
    assert parsed.source in ("local", "sidecar") and kubernetes in ("auto", "true", "false")


@fuzz(CHECK_EXAMPLES)
@given(INSTANCES)
def test_constructing_the_check_raises_only_configuration_error(tmp_path_factory, instance):
    # With the sidecar as source and no Kubernetes, constructing the check touches neither NVML nor a kubelet.
    missing = str(tmp_path_factory.getbasetemp() / "no-sidecar.sock")
    instance = dict(instance, source="sidecar", kubernetes=False, sidecar_socket=missing)
    try:
        GpuMonitoringCheck("gpu_monitoring", {}, [instance])
    except ConfigurationError as error:
        assert str(error)
        event("refused")
        return
    event("constructed")


# --- cgroup lines ---------------------------------------------------------------------------

HEX = "0123456789abcdef"
HEX64 = st.text(HEX, min_size=64, max_size=64)
UUID = st.uuids().map(str)
UID_32 = st.text(HEX, min_size=32, max_size=32)
RUNTIMES = ["cri-containerd-", "crio-", "docker-", "libpod-", "libpod-payload-", "nerdctl-", ""]


@st.composite
def cgroup_segment(draw):
    uid = draw(UUID | UID_32)
    container = draw(HEX64)
    return draw(st.sampled_from([
        "kubepods", "kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice", "besteffort",
        "burstable", f"pod{uid}", f"kubepods-pod{uid.replace('-', '_')}.slice",
        f"kubepods-burstable-pod{uid.replace('-', '_')}.slice", f"kubelet-kubepods-pod{uid.replace('-', '_')}.slice",
        f"{draw(st.sampled_from(RUNTIMES))}{container}", f"{draw(st.sampled_from(RUNTIMES))}{container}.scope",
        f"crio-conmon-{container}.scope", f"libpod-conmon-{container}", f"backup-{container}.service",
        "system.slice", "user.slice", "machine.slice", "docker", "default", "container", "init.scope",
        "slurm", f"slurm_{draw(st.text(string.ascii_lowercase, min_size=1, max_size=6))}",
        f"uid_{draw(st.integers(0, 2**32))}", f"job_{draw(st.integers(0, 10**9))}",
        f"step_{draw(st.sampled_from(['0', '1', 'batch', 'extern', 'interactive', 'x/y']))}",
        f"task_{draw(st.integers(0, 64))}", "user", "slurmstepd.scope", "node1_slurmstepd.scope",
        container[: draw(st.integers(0, 63))], draw(TEXT),
    ]))


@st.composite
def cgroup_line(draw):
    number = draw(st.sampled_from(["0", "1", "4", "12", "", "x"]))
    controller = draw(st.sampled_from(["", "memory", "cpu,cpuacct", "name=systemd", "rdma", "pids:x"]))
    path = "/".join(draw(st.lists(cgroup_segment(), max_size=7)))
    deleted = draw(st.sampled_from(["", " (deleted)"]))
    return f"{number}:{controller}:/{path}{deleted}"


CGROUP_TEXT = st.lists(cgroup_line(), max_size=6).map("\n".join)
_POD_UID = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}|[0-9a-f]{32}")


def _assert_owner(owner):
    assert isinstance(owner, ProcessOwner)
    assert owner.container_id is None or re.fullmatch(r"[0-9a-f]{64}", owner.container_id)
    assert owner.pod_uid is None or _POD_UID.fullmatch(owner.pod_uid)
    assert owner.slurm is None or (isinstance(owner.slurm, SlurmJob) and owner.slurm.job_id.isdigit())


@fuzz(PARSER_EXAMPLES)
@given(st.text(st.characters(categories=None, codec=None)) | CGROUP_TEXT)
def test_parse_cgroup_always_names_an_owner(text):
    _assert_owner(parse_cgroup(text))


@fuzz(PARSER_EXAMPLES)
@given(UUID, HEX64, st.sampled_from(["", "-besteffort", "-burstable"]),
       st.sampled_from(["cri-containerd-", "crio-", "docker-"]), st.lists(st.sampled_from(
           ["1:rdma:/", "0::/", "2:cpuset:/", "3:name=systemd:/init.scope"]), max_size=3), st.booleans())
def test_parse_cgroup_reads_the_layouts_runtimes_write(uid, container, qos, runtime, host_lines, systemd):
    if systemd:
        slice_uid = uid.replace("-", "_")
        path = f"/kubepods.slice/kubepods{qos}.slice/kubepods{qos}-pod{slice_uid}.slice/{runtime}{container}.scope"
    else:
        path = f"/kubepods/{qos.lstrip('-')}/pod{uid}/{container}".replace("//", "/")
    # Hierarchies still at the root (rdma, the hybrid 0:: line) come first in real files.
    owner = parse_cgroup("\n".join([*host_lines, f"0::{path}", ""]))
    assert owner == ProcessOwner(container, uid)


# --- device IDs -----------------------------------------------------------------------------

HEX_UUID = st.lists(st.text("0123456789abcdefABCDEF", min_size=1, max_size=12), min_size=1, max_size=5).map("-".join)


@fuzz(PARSER_EXAMPLES)
@given(st.text(st.characters(categories=None, codec=None)) | st.builds(
    "".join, st.lists(st.sampled_from(["GPU-", "MIG-", "nvidia", "::", "/", "gi", "vgpu", "0", "7", "12", "a-f",
                                       "-", "\n", "٣", "MIG-GPU-"]), max_size=8)))
def test_parse_device_id_returns_a_ref_or_value_error(raw):
    try:
        ref = parse_device_id(raw)
    except ValueError as error:
        assert str(error)
        return
    assert isinstance(ref, DeviceRef) and ref.raw == raw
    assert ref.uuid is not None or ref.minor is not None


@fuzz(PARSER_EXAMPLES)
@given(st.sampled_from(["GPU-", "MIG-"]), HEX_UUID, st.none() | st.integers(0, 10**6))
def test_parse_device_id_reads_nvml_uuids_with_replicas(kind, uuid, replica):
    raw = f"{kind}{uuid}" + ("" if replica is None else f"::{replica}")
    assert parse_device_id(raw) == DeviceRef(raw=raw, uuid=f"{kind}{uuid}", replica=replica)


@fuzz(PARSER_EXAMPLES)
@given(st.integers(0, 10**6), st.sampled_from(["", "vgpu", "gi"]), st.integers(0, 10**6))
def test_parse_device_id_reads_device_minors(minor, kind, sub):
    raw = f"nvidia{minor}" + (f"/{kind}{sub}" if kind else "")
    expected = {"vgpu": {"vgpu": sub}, "gi": {"gpu_instance": sub}, "": {}}[kind]
    assert parse_device_id(raw) == DeviceRef(raw=raw, minor=minor, **expected)


# --- kubelet /pods --------------------------------------------------------------------------

NAME = st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=12)


@st.composite
def pod(draw):
    containers = draw(st.lists(NAME, min_size=1, max_size=3, unique=True))
    return {
        "metadata": {"uid": draw(UUID), "name": draw(NAME), "namespace": draw(NAME)},
        "spec": {"containers": [
            {"name": name, "resources": {"limits": {"nvidia.com/gpu": draw(st.integers(0, 8)), "cpu": "1"}},
             "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "X", "valueFrom": {}}]}
            for name in containers]},
        "status": {"phase": draw(st.sampled_from(["Running", "Pending", "Succeeded"])), "containerStatuses": [
            {"name": name, "containerID": f"containerd://{draw(HEX64)}"} for name in containers]},
    }


POD_LISTS = st.builds(lambda items: {"kind": "PodList", "apiVersion": "v1", "items": items},
                      st.lists(pod(), max_size=3))


def _parse_pods(payload):
    try:
        pods = parse_pod_list(payload)
    except ValueError as error:
        assert str(error)
        return None
    assert isinstance(pods, list) and all(isinstance(p, PodInfo) for p in pods)
    return pods


@fuzz(PARSER_EXAMPLES)
@given(JSON | st.builds(lambda items: {"items": items}, JSON))
def test_parse_pod_list_of_anything_is_pods_or_value_error(payload):
    _parse_pods(payload)


@fuzz(PARSER_EXAMPLES)
@given(st.data(), POD_LISTS)
def test_parse_pod_list_of_a_damaged_list_is_pods_or_value_error(data, pods):
    damaged = mutated(data, pods)
    parsed = _parse_pods(damaged)
    if parsed is not None:
        # A damaged pod costs itself alone: every pod the damage left as it was is read.
        intact = [item for item in damaged["items"] if item in pods["items"]]
        assert {i["metadata"]["uid"] for i in intact} <= {p.uid for p in parsed}


def _read(reader, document, separators):
    try:
        return reader.read(json.dumps(document, separators=separators).encode())[0]
    except ValueError:
        return ValueError


@fuzz(PARSER_EXAMPLES)
@given(st.data(), POD_LISTS, st.sampled_from([(",", ":"), (", ", ": ")]))
def test_reading_answers_pod_by_pod_is_reading_them_whole(data, pods, separators):
    reader = PodListReader()
    assert _read(reader, pods, separators) == parse_pod_list(pods)
    damaged = mutated(data, pods)
    try:
        expected = parse_pod_list(json.loads(json.dumps(damaged)))
    except ValueError:
        expected = ValueError
    assert _read(reader, damaged, separators) == expected


@fuzz(PARSER_EXAMPLES)
@given(POD_LISTS)
def test_parse_pod_list_reads_a_good_list_whole(pods):
    parsed = parse_pod_list(json.loads(json.dumps(pods)))
    assert [(p.uid, p.name, p.namespace) for p in parsed] == [
        (i["metadata"]["uid"], i["metadata"]["name"], i["metadata"]["namespace"]) for i in pods["items"]]
    for info, item in zip(parsed, pods["items"]):
        statuses = {s["name"]: s["containerID"].split("://")[1] for s in item["status"]["containerStatuses"]}
        assert {c.name: c.container_id for c in info.containers} == statuses


# --- pod-resources messages -----------------------------------------------------------------


def _varint(value):
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number, payload):
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _text(number, value):
    return _field(number, value.encode("utf-8"))


def unknown_fields(first):
    """Fields a newer kubelet sends that the decoder must skip, numbered from `first`: every wire type it can meet."""
    numbers = st.integers(first, 99)
    return st.one_of(
        st.builds(lambda n, v: _varint(n << 3) + _varint(v), numbers, st.integers(0, 2**64 - 1)),
        st.builds(lambda n, v: _varint(n << 3 | 1) + v, numbers, st.binary(min_size=8, max_size=8)),
        st.builds(lambda n, v: _varint(n << 3 | 5) + v, numbers, st.binary(min_size=4, max_size=4)),
        st.builds(lambda n, v: _field(n, v), numbers, st.binary(max_size=8)),
    )


UNKNOWN_FIELD = unknown_fields(4)
UTF8 = st.text(max_size=16)  # surrogates excluded: protobuf strings are valid UTF-8


def _insert(draw, ordered, extra):
    """`ordered` (whose order means something) with each of `extra` at any place among them."""
    fields = list(ordered)
    for field in extra:
        fields.insert(draw(st.integers(0, len(fields))), field)
    return b"".join(fields)


@st.composite
def devices(draw):
    resource = draw(UTF8)
    ids = draw(st.lists(UTF8, max_size=3))
    extra = [_text(1, resource), *draw(st.lists(UNKNOWN_FIELD, max_size=2))]
    return _insert(draw, [_text(2, i) for i in ids], extra), resource, ids


DEVICE_NAME = st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=12)
DRIVERS = st.sampled_from([GPU_DRIVER, "compute-domain.nvidia.com"])


@st.composite
def claim_resource(draw, claim):
    """A Kubernetes 1.31+ ClaimResource (a device its driver names) and the allocation it makes of `claim`."""
    driver, device, pool, share = draw(DRIVERS), draw(UTF8), draw(UTF8), draw(st.none() | UTF8)
    fields = [_text(2, driver), _text(3, pool), _text(4, device), _field(1, _text(1, draw(UTF8)))]
    fields += [_text(5, share)] if share is not None else []
    encoded = _insert(draw, [], fields + draw(st.lists(unknown_fields(6), max_size=2)))
    return encoded, dataclasses.replace(claim, resource_name=driver, device_id=device, pool=pool or None,
                                        share_id=share)


@st.composite
def cdi_claim_resource(draw, claim):
    """A ClaimResource before Kubernetes 1.31 (CDI device names alone) and the allocations it makes of `claim`."""
    names, found = [], []
    for _ in range(draw(st.integers(0, 3))):
        device = draw(DEVICE_NAME)
        name = draw(st.sampled_from([
            f"k8s.{GPU_DRIVER}/claim={draw(UUID)}-{device}", f"k8s.{GPU_DRIVER}/device={device}",
            f"k8s.compute-domain.nvidia.com/claim={draw(UUID)}-{device}", "k8s.gpu.resource.nvidia.com/claim=common",
        ]))
        names.append(_field(1, _text(1, name)))
        if name.startswith(f"k8s.{GPU_DRIVER}/"):
            found.append(dataclasses.replace(claim, resource_name=GPU_DRIVER, device_id=device))
    return _insert(draw, names, draw(st.lists(unknown_fields(6), max_size=2))), found


@st.composite
def dynamic_resource(draw, namespace, pod, container):
    """A DynamicResource of either layout and the allocations of NVIDIA's GPU driver it holds, each once."""
    claim_name, claim_namespace = draw(UTF8), draw(UTF8)
    claim = Allocation(namespace, pod, container, GPU_DRIVER, "", claim_name=claim_name,
                       claim_namespace=claim_namespace or namespace)
    fields, found = [_text(2, claim_name), _text(3, claim_namespace)], []
    if draw(st.booleans()):
        resources = [(encoded, [made]) for encoded, made in draw(st.lists(claim_resource(claim), max_size=3))]
    else:
        fields.append(_text(1, draw(UTF8)))  # class_name, before 1.31
        resources = draw(st.lists(cdi_claim_resource(claim), max_size=2))
    for allocation in (a for _, made in resources for a in made):
        if allocation.resource_name == GPU_DRIVER and allocation not in found:
            found.append(allocation)
    extra = fields + draw(st.lists(unknown_fields(6), max_size=1))
    return _insert(draw, [_field(4, encoded) for encoded, _ in resources], extra), found


@st.composite
def list_response(draw):
    """A ListPodResourcesResponse as the kubelet serialises it, and the allocations it holds."""
    message, expected = b"", []
    for _ in range(draw(st.integers(0, 3))):
        namespace, name = draw(UTF8), draw(UTF8)
        pod_fields, pod_expected = [_text(1, name), _text(2, namespace)], []
        for _ in range(draw(st.integers(0, 2))):
            container = draw(UTF8)
            container_fields, container_expected = [], []
            for encoded, resource, ids in draw(st.lists(devices(), max_size=2)):
                container_fields.append(_field(2, encoded))
                container_expected += [Allocation(namespace, name, container, resource, i) for i in ids]
            # DRA claims (field 5), in their order among the devices, come after them whatever their place.
            at = 0
            for encoded, claimed in draw(st.lists(dynamic_resource(namespace, name, container), max_size=2)):
                at = draw(st.integers(at, len(container_fields)))
                container_fields.insert(at, _field(5, encoded))
                at += 1
                container_expected += claimed
            # The container's name may come after its devices; the decoder must still name them.
            pod_fields.append(_field(3, _insert(draw, container_fields, [_text(1, container)])))
            pod_expected += container_expected
        message += _field(1, b"".join(pod_fields[:2][::draw(st.sampled_from([1, -1]))] + pod_fields[2:]))
        message += b"".join(draw(st.lists(UNKNOWN_FIELD, max_size=1)))
        expected += pod_expected
    return message, expected


@st.composite
def allocatable_response(draw):
    message, expected = b"", []
    for encoded, resource, ids in draw(st.lists(devices(), max_size=4)):
        message += _field(1, encoded) + b"".join(draw(st.lists(UNKNOWN_FIELD, max_size=1)))
        expected += [Advertised(resource, i) for i in ids]
    # CPU IDs (field 2, packed varints) and memory (field 3) are no GPU's: skipped whole.
    message += _field(2, b"".join(_varint(c) for c in draw(st.lists(st.integers(0, 256), max_size=4))))
    return message, expected


@st.composite
def damaged(draw, good):
    payload = bytearray(draw(good)[0])
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "splice"]))
        at = draw(st.integers(0, len(payload)))
        if how == "flip" and payload:
            at = min(at, len(payload) - 1)
            payload[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "truncate":
            del payload[at:]
        elif how == "insert":
            payload[at:at] = draw(st.binary(min_size=1, max_size=4) | st.sampled_from([b"\xff" * 11, b"\x00", b"\x07"]))
        elif how == "delete":
            del payload[at:at + draw(st.integers(1, 4))]
        else:
            payload[at:at] = payload[: draw(st.integers(0, len(payload)))]
    return bytes(payload)


def _decode(decoder, payload):
    try:
        return decoder(payload)
    except PodResourcesError as error:
        assert error.reason == "invalid" and str(error)
        return None


@fuzz(PARSER_EXAMPLES)
@given(st.binary(max_size=256) | damaged(list_response()))
def test_decode_allocations_of_any_bytes_is_allocations_or_invalid(payload):
    result = _decode(decode_allocations, payload)
    assert result is None or all(isinstance(a, Allocation) for a in result)


@fuzz(PARSER_EXAMPLES)
@given(st.binary(max_size=256) | damaged(allocatable_response()))
def test_decode_allocatable_of_any_bytes_is_advertised_or_invalid(payload):
    result = _decode(decode_allocatable, payload)
    assert result is None or all(isinstance(a, Advertised) for a in result)


@fuzz(PARSER_EXAMPLES)
@given(list_response())
def test_decode_allocations_reads_what_the_kubelet_writes(response):
    payload, expected = response
    assert decode_allocations(payload) == expected


@fuzz(PARSER_EXAMPLES)
@given(allocatable_response())
def test_decode_allocatable_reads_what_the_kubelet_writes(response):
    payload, expected = response
    assert decode_allocatable(payload) == expected


def test_the_hand_encoding_is_the_kubelet_s():
    """The encoder above agrees with protobuf's own, through the simulator's descriptor of the API."""
    from gpu_monitoring.simulator.pod_resources_server import _message_classes

    classes = _message_classes(False)
    response = classes["ListPodResourcesResponse"]()
    pod = response.pod_resources.add(name="train", namespace="ml")
    pod.containers.add(name="main").devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-1", "GPU-2"])
    ours = _field(1, _text(1, "train") + _text(2, "ml") + _field(3, _text(1, "main") + _field(
        2, _text(1, "nvidia.com/gpu") + _text(2, "GPU-1") + _text(2, "GPU-2"))))
    assert ours == response.SerializeToString()


