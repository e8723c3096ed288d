"""Every shape of kubelet device ID maps to its GPU or MIG instance; none is dropped silently.

GKE's device plugin names GPUs by device-node minor (`nvidia<N>`, `nvidia<N>/vgpu<k>`,
`nvidia<N>/gi<M>`), which need not follow NVML's index order: the node below numbers its
minors differently from its indexes so that a lookup by index would land on the wrong GPU.
"""

import logging

import pytest

from .attribution_support import funnel, instance_workloads, pod_tags, workloads
from .conftest import H100_PCIE_NODE, tag_dict

LITERAL_UUID = "GPU-11111111-2222-3333-4444-555555555555"
GHOSTS = {
    "GPU-99999999-9999-9999-9999-999999999999": "matches no GPU or MIG instance",
    "nvidia9": "matches no GPU or MIG instance",  # no device node 9
    "gke:0/gi7": "matches no GPU or MIG instance",  # GPU 0 (nvidia3) has no MIG instance 7
    "bogus-device": "unrecognised NVIDIA device ID 'bogus-device'",
}

SCENARIO = H100_PCIE_NODE + f"""
description: Five H100 PCIe named by a GKE-style device plugin, plus IDs that match nothing.
devices:
  - {{model: h100, minor_number: 3, load: {{utilization: 70, memory_used_mib: 1000}},
     processes: [{{pid: 100, name: trainer, memory_mib: 1000}}]}}
  - {{model: h100, minor_number: 0, load: {{utilization: 40, memory_used_mib: 2000}},
     processes: [{{pid: 110, name: a, memory_mib: 1000}}, {{pid: 111, name: b, memory_mib: 1000}}]}}
  - model: h100
    minor_number: 1
    mig:
      - {{profile: 3g.40gb, gi: 1, memory_mib: 40192, utilization: 60,
         processes: [{{pid: 120, name: mig-job, memory_mib: 20000}}]}}
      - {{profile: 1g.10gb, gi: 5, memory_mib: 9856, utilization: 0}}
  - {{model: h100, minor_number: 2, uuid: {LITERAL_UUID}, load: {{utilization: 55, memory_used_mib: 500}},
     processes: [{{pid: 130, name: literal, memory_mib: 500}}]}}
  - {{model: h100, minor_number: 4, load: {{utilization: 30, memory_used_mib: 500}},
     processes: [{{pid: 140, name: custom, memory_mib: 500}}]}}
kubernetes:
  pods:
    - name: gke-whole
      containers: [{{name: c, devices: ["gke:0"], processes: [100]}}]
    - name: gke-share-0
      containers: [{{name: c, devices: ["gke:1/vgpu0"], processes: [110]}}]
    - name: gke-share-1
      containers: [{{name: c, devices: ["gke:1/vgpu1"], processes: [111]}}]
    - name: gke-mig
      containers: [{{name: c, resource: nvidia.com/mig-3g.40gb, devices: ["gke:2/gi1"], processes: [120]}}]
    - name: literal
      containers: [{{name: c, devices: ["{LITERAL_UUID}"], processes: [130]}}]
    - name: custom
      containers: [{{name: c, resource: example.com/gpu-large, devices: ["gpu:4"], processes: [140]}}]
    - name: fpga
      containers:
        - {{name: c, resource: xilinx.com/fpga, devices: ["fpga-0", "GPU-00000000-0000-0000-0000-000000000000"]}}
    - name: ghost
      containers: [{{name: c, devices: {list(GHOSTS)}}}]
"""
CUSTOM = {"gpu_resource_names": ["example.com/gpu*"]}


@pytest.fixture
def scenario(tmp_path):
    path = tmp_path / "gke.yaml"
    path.write_text(SCENARIO)
    return path


def test_the_scenario_serves_gke_ids(node, scenario):
    served = {(a.pod, a.device_id) for a in node(scenario).check.simulated_node.allocations()}
    assert {("gke-whole", "nvidia3"), ("gke-share-0", "nvidia0/vgpu0"), ("gke-share-1", "nvidia0/vgpu1"),
            ("gke-mig", "nvidia1/gi1"), ("literal", LITERAL_UUID), ("ghost", "nvidia3/gi7")} <= served


def test_each_shape_maps_to_its_gpu_or_instance(node, scenario):
    gke = node(scenario, **CUSTOM).run(2)
    assert workloads(gke, "workload.gpus") == {
        (0, "gke-whole"): 1,  # nvidia3: GPU 0, whose device node is minor 3
        (1, "gke-share-0"): 0.5,  # nvidia0/vgpu0 and /vgpu1: two time-shared replicas of GPU 1
        (1, "gke-share-1"): 0.5,
        (3, "literal"): 1,  # GPU-<uuid>
        (4, "custom"): 1,  # a configured resource name
    }
    assert instance_workloads(gke, "workload.gpus") == pytest.approx({(2, 1, "gke-mig"): 3 / 7})
    assert funnel(gke)["allocated"] == 5
    modes = {int(tags["gpu_index"]): (tags["gpu_slicing_mode"], tags["gpu_sharing_mode"])
             for tags in (tag_dict(s.tags) for s in gke.health().values())}
    assert modes == {0: ("none", "none"), 1: ("none", "time_slicing"), 2: ("mig-parent", "none"),
                     3: ("none", "none"), 4: ("none", "none")}
    # Exclusive GPUs and the held MIG instance carry their pod; the time-shared GPU does not.
    pods = {int(tag_dict(s.tags)["gpu_index"]): pod_tags(s.tags).get("pod_name") for s in gke.series("memory.used")
            if "gpu_instance_id" not in tag_dict(s.tags)}
    assert pods == {0: "gke-whole", 1: None, 2: None, 3: "literal", 4: "custom"}
    instances = {int(tag_dict(s.tags)["gpu_instance_id"]): pod_tags(s.tags).get("pod_name")
                 for s in gke.series("memory.used") if "gpu_instance_id" in tag_dict(s.tags)}
    assert instances == {1: "gke-mig", 5: None}


def test_ids_that_match_nothing_are_reported(node, scenario, caplog):
    caplog.set_level(logging.WARNING)
    gke = node(scenario, **CUSTOM).run()
    warnings = gke.check.warnings
    assert len(warnings) == len(GHOSTS), warnings
    served = {a.device_id for a in gke.check.simulated_node.allocations() if a.pod == "ghost"}
    for raw in served:
        (line,) = [w for w in warnings if raw in w]
        assert line.startswith("pod-resources: default/ghost/c: ")
    for problem in GHOSTS.values():
        assert any(problem in w for w in warnings), (problem, warnings)
    # The warnings reach the Agent's log as well as its status page.
    assert sum("default/ghost/c" in r.getMessage() for r in caplog.records) == len(GHOSTS)
    # The ghost pod is no workload and holds nothing.
    assert "ghost" not in {pod for _, pod in workloads(gke, "workload.gpus")}


def test_non_gpu_resources_are_ignored_quietly(node, scenario):
    gke = node(scenario, **CUSTOM).run()
    # The FPGA pod's devices (one of them even looks like a GPU UUID) are not GPUs: not reported, not held.
    assert not any("fpga" in w or "GPU-00000000" in w for w in gke.check.warnings)
    assert "fpga" not in {pod for _, pod in workloads(gke, "workload.gpus")}


def test_an_unconfigured_resource_name_is_not_an_allocation(node, scenario):
    gke = node(scenario).run()
    # Without gpu_resource_names, example.com/gpu-large is some other resource: GPU 4 is not allocated.
    assert funnel(gke)["allocated"] == 4
    assert gke.values("cost.hourly") == {}
    assert not any("custom" in w for w in gke.check.warnings)
    pods = {int(tag_dict(s.tags)["gpu_index"]): pod_tags(s.tags).get("pod_name") for s in gke.series("memory.used")
            if "gpu_instance_id" not in tag_dict(s.tags)}
    assert pods[0] == "gke-whole"


def test_a_container_on_a_gpu_it_was_not_given_holds_none_of_it(node, scenario):
    gke = node(scenario, default_hourly_price=2.0).run(2)
    # GPU 4 is not allocated (example.com/gpu-large is not configured) and so idle for the funnel and cost...
    assert funnel(gke)["allocated"] == 4
    assert gke.values("cost.idle_hourly")[4] == 2.0
    # ...so the container that runs on it was given none of it, as for a GPU some other pod holds.
    assert workloads(gke, "workload.gpus")[(4, "custom")] == 0
    assert workloads(gke, "workload.cost.hourly")[(4, "custom")] == 0
