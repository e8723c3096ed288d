"""The simulated dcgm-exporter: its page in the real format, label set and counters, values that
follow the simulated load and change only with DCGM's samples, and its pod in the kubelet's list."""

import urllib.error
import urllib.request

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.dcgm_exporter_server import DEFAULT_COUNTERS, PROFILING_COUNTERS
from gpu_monitoring.simulator.node import simulated_node
from gpu_monitoring.simulator.scenario import ScenarioError

GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "DCGM_FI_DRIVER_VERSION"}
POD_LABELS = {"container", "namespace", "pod"}
INTERVAL = 30


@pytest.fixture
def started():
    """started(scenario, at=scenario seconds) -> a started SimulatedNode on a clock that stands still."""
    nodes = []

    def start(scenario, at=95.0):
        node = simulated_node(scenario, SimClock(speed=0, start=at))
        nodes.append(node)
        node.start()
        return node

    yield start
    for node in nodes:
        node.stop()


def fetch(node):
    with urllib.request.urlopen(node.dcgm_exporter.url, timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return answer.read().decode()


def families(node):
    return {family.name: family for family in text_string_to_metric_families(fetch(node))}


def samples(node, field):
    """{(gpu, GPU_I_ID or None): (labels, value)} of one counter."""
    out = {}
    for sample in families(node)[field].samples:
        key = (int(sample.labels["gpu"]), int(sample.labels["GPU_I_ID"]) if "GPU_I_ID" in sample.labels else None)
        assert key not in out, f"{field} twice for {key}"
        out[key] = (sample.labels, sample.value)
    return out


def test_the_page_has_every_default_counter_and_no_profiling_one_by_default(started):
    found = families(started("l4-dcgm"))
    assert [name for name in found] == [c.field for c in DEFAULT_COUNTERS]
    assert {name: family.type for name, family in found.items()} == {c.field: c.kind for c in DEFAULT_COUNTERS}
    # An L4 has no memory temperature sensor: DCGM's value is blank, and dcgm-exporter leaves it out.
    empty = {name for name, family in found.items() if not family.samples}
    assert empty == {"DCGM_FI_DEV_MEMORY_TEMP"}
    assert all(len(family.samples) == 8 for name, family in found.items() if name not in empty)


def test_profiling_counters_are_there_when_the_scenario_turns_them_on(started):
    found = families(started("t4-shared"))
    assert set(found) == {c.field for c in DEFAULT_COUNTERS + PROFILING_COUNTERS}
    assert [s.labels["gpu"] for s in found["DCGM_FI_PROF_SM_ACTIVE"].samples] == ["0", "1"]


def test_each_gpu_has_the_exporters_labels_and_its_holders(started):
    node = started("l4-dcgm")
    by_gpu = samples(node, "DCGM_FI_DEV_GPU_TEMP")
    assert sorted(by_gpu) == [(i, None) for i in range(8)]
    for (index, _), (labels, _) in by_gpu.items():
        device = node.nvml.devices[index]
        held = index < 7
        assert set(labels) == GPU_LABELS | {"Hostname"} | (POD_LABELS if held else set())
        assert labels["UUID"] == device.spec.uuid and labels["pci_bus_id"] == device.spec.pci_bus_id
        assert (labels["device"], labels["modelName"]) == (f"nvidia{index}", "NVIDIA L4")
        assert labels["DCGM_FI_DRIVER_VERSION"] == "550.90.07"
    labels = by_gpu[(0, None)][0]
    assert (labels["namespace"], labels["pod"], labels["container"]) == ("serving", "llm-serving-6d9f7c5b8-4xk2p",
                                                                         "triton")


def test_a_newer_exporter_names_its_host_label_hostname(started):
    for labels, _ in samples(started("t4-shared"), "DCGM_FI_DEV_GPU_TEMP").values():
        assert "hostname" in labels and "Hostname" not in labels


def test_a_gpu_in_mig_mode_is_watched_as_its_gpu_instances(started):
    node = started("a100-mig")
    sm_active = samples(node, "DCGM_FI_PROF_SM_ACTIVE")
    assert sorted(sm_active) == [(0, 2), (0, 3), (0, 9), (0, 10), (1, 7), (1, 8), (1, 9), (1, 10), (1, 11),
                                 (1, 12), (1, 13), (2, None), (3, 0)]
    labels, _ = sm_active[(0, 2)]
    assert labels["UUID"] == node.nvml.devices[0].spec.uuid  # the parent's, as dcgm-exporter sends it
    assert (labels["GPU_I_PROFILE"], labels["pod"], labels["container"]) == ("3g.40gb", "train-large", "trainer")
    assert "GPU_I_ID" not in sm_active[(2, None)][0]
    # NVML's utilization has no value on a GPU instance, nor has DCGM's.
    assert sorted(samples(node, "DCGM_FI_DEV_GPU_UTIL")) == [(2, None)]
    # Each instance's own memory.
    assert samples(node, "DCGM_FI_DEV_FB_USED")[(0, 2)][1] == 31000


def test_activity_follows_the_load_as_gpm_would_measure_it(started):
    node = started("a100-mig", at=95.0)
    sm_active = {key: value for key, (_, value) in samples(node, "DCGM_FI_PROF_SM_ACTIVE").items()}
    graphics = {key: value for key, (_, value) in samples(node, "DCGM_FI_PROF_GR_ENGINE_ACTIVE").items()}
    parent = node.nvml.devices[0]
    for instance in parent.mig:
        # DCGM's last sample at t=90 covers the 30 s before it; the ratio is GPM's percent / 100.
        expected = parent.profile(instance.load, 60.0, 90.0)
        key = (0, instance.spec.gpu_instance_id)
        assert sm_active[key] == pytest.approx(expected["sm"] / 100, abs=1e-6)
        assert graphics[key] == pytest.approx(expected["graphics"] / 100, abs=1e-6)
    assert sm_active[(0, 10)] == 0  # an instance nothing runs on
    assert sm_active[(0, 2)] > sm_active[(0, 3)] > sm_active[(0, 9)] > 0
    assert 0 < sm_active[(2, None)] < graphics[(2, None)] <= 1


def test_values_change_only_with_dcgms_samples(started):
    node = started("t4-shared", at=61.0)
    first = fetch(node)
    node.nvml.advance(INTERVAL - 2)  # t=89: the sample of t=60 still stands
    assert fetch(node) == first
    node.nvml.advance(2)  # t=91: DCGM sampled at t=90
    later = fetch(node)
    assert later != first
    before = samples_of(first, "DCGM_FI_PROF_SM_ACTIVE")
    assert samples_of(later, "DCGM_FI_PROF_SM_ACTIVE") != before


def samples_of(text, field):
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == field]
    return [s.value for s in family.samples]


def test_a_stale_exporter_keeps_its_last_sample(started):
    node = started("t4-shared")
    node.dcgm_exporter.behaviour = "stale"
    first = fetch(node)
    node.nvml.advance(10 * INTERVAL)
    assert fetch(node) == first


def test_a_scenario_without_the_block_runs_no_exporter(started):
    node = started("l4-mixed")
    assert node.dcgm_exporter is None
    assert not any(pod["name"].startswith("nvidia-dcgm-exporter") for pod in node._kubelet_pods())


def test_the_kubelet_lists_the_exporters_pod_as_the_gpu_operator_deploys_it(started):
    node = started("l4-dcgm")
    kubelet = node.kubelet
    answer = requests.get(kubelet.pods_url, headers={"Authorization": "Bearer secret"}, verify=kubelet.ca_path,
                          timeout=10)
    (pod,) = [p for p in answer.json()["items"] if p["metadata"]["name"].startswith("nvidia-dcgm-exporter-")]
    assert pod["metadata"]["namespace"] == "gpu-operator"
    assert pod["metadata"]["labels"] == {"app": "nvidia-dcgm-exporter"}
    assert pod["status"]["phase"] == "Running" and pod["status"]["podIP"] == "127.0.0.1"
    assert {"type": "Ready", "status": "True"} in pod["status"]["conditions"]
    (container,) = pod["spec"]["containers"]
    assert "dcgm-exporter" in container["image"]
    (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
    assert all(status["ready"] for status in pod["status"]["containerStatuses"])
    # What discovery does with it: the metrics port on the pod's IP.
    url = f"http://{pod['status']['podIP']}:{port['containerPort']}/metrics"
    assert url == node.dcgm_exporter.url
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE{" in requests.get(url, timeout=10).text


def test_the_exporter_stops_with_the_node(started):
    node = started("a100-mig")
    url = node.dcgm_exporter.url
    node.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


@pytest.mark.parametrize("block", ["{counters: all}", "{hostname_label: HOSTNAME}", "{interval: 0}", "{port: 1}"])
def test_a_wrong_exporter_block_is_a_scenario_error(tmp_path, block):
    scenario = tmp_path / "node.yaml"
    scenario.write_text(f"driver: {{version: '550.90.07'}}\ndevices: []\ndcgm_exporter: {block}\n")
    with pytest.raises(ScenarioError, match="dcgm_exporter|port"):
        simulated_node(str(scenario))
