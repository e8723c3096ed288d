"""NVLink fabric registration (nvmlDeviceGetGpuFabricInfoV) in series, tags and device health.

Scenario hgx-b200: 8 B200 registered in one clique on driver 580 (v3 structure, health summary);
at t=40 GPU 6 loses its registration for 20 s. dgx-h100's driver 550 knows only the v2 structure.
Tests that need other answers write a copy of hgx-b200 with its fabric changed.
"""

import pytest
import yaml
from datadog_checks.base import AgentCheck

from gpu_monitoring.simulator.scenario import resolve

OK, WARNING, CRITICAL = AgentCheck.OK, AgentCheck.WARNING, AgentCheck.CRITICAL
CLUSTER = "5f1c9a2e-7b3d-4e8a-9c61-2d4b8e0f3a17"
FABRIC_CALL = "nvmlDeviceGetGpuFabricInfoV"


def board(tmp_path, fabric=None, faults=(), driver=None):
    """A copy of hgx-b200 whose B200s answer `fabric` (merged into theirs) and have only `faults`."""
    scenario = yaml.safe_load(resolve("hgx-b200").read_text())
    scenario["models"]["b200"]["fabric"].update(fabric or {})
    scenario["faults"] = list(faults)
    if driver:
        scenario["driver"]["version"] = driver
    path = tmp_path / "board.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return str(path)


def reasons(node, index):
    return node.health()[index].message or ""


def test_registered_gpus_report_state_summary_and_group_by_clique(node):
    b200 = node("hgx-b200").run(1)  # t=0, before the timeline's faults
    assert b200.values("fabric.state") == dict.fromkeys(range(8), 3)
    assert b200.values("fabric.health.summary") == dict.fromkeys(range(8), 1)
    for flag in ("degraded_bandwidth", "route_recovery", "route_unhealthy", "access_timeout_recovery"):
        assert b200.values(f"fabric.health.{flag}") == dict.fromkeys(range(8), 0)
    clusters = b200.keyed("fabric.state", lambda t: (t["gpu_index"], t["gpu_clique_id"], t["gpu_cluster_uuid"]))
    assert {(clique, cluster) for _, clique, cluster in clusters} == {("1", CLUSTER)}
    assert set(b200.statuses().values()) == {OK}


def test_driver_550_is_asked_v3_once_then_v2_every_run(node):
    dgx = node("dgx-h100").run(1)
    assert dgx.values("fabric.state") == dict.fromkeys(range(8), 3)
    # R550 has no health summary, and of the health flags only degraded bandwidth.
    assert dgx.values("fabric.health.summary") == {}
    assert dgx.values("fabric.health.route_recovery") == {}
    assert dgx.values("fabric.health.degraded_bandwidth") == dict.fromkeys(range(8), 0)
    dgx.sim.calls.clear()
    dgx.run(2)
    assert dgx.sim.calls[FABRIC_CALL] == 2 * 8
    # No GPU is faulted for its fabric: GPU 7's one warning is the memory a failed pod's process holds.
    assert {index for index, status in dgx.statuses().items() if status != OK} == {7}
    assert reasons(dgx, 7).startswith("no workload holds this GPU") and "pid 90114" in reasons(dgx, 7)
    assert "fabric" not in reasons(dgx, 7).lower()


def test_a_gpu_without_a_fabric_is_not_asked_again(node):
    grace = node("gh200").run(1)  # no NVSwitch: the driver answers NOT_SUPPORTED
    grace.sim.calls.clear()
    grace.run(2)
    assert grace.sim.calls[FABRIC_CALL] == 0
    assert grace.values("fabric.state") == {}


def test_lost_registration_is_critical_and_clears(node):
    b200 = node("hgx-b200").run_until(45)
    assert b200.health()[6].status == CRITICAL
    assert "lost its NVLink fabric registration (state: not started)" in reasons(b200, 6)
    assert "nvidia-fabricmanager" in reasons(b200, 6)
    assert b200.values("fabric.state")[6] == 1
    b200.run_until(60)
    assert b200.health()[6].status == OK


@pytest.mark.parametrize("grace, status", [(0, CRITICAL), (300, OK)])
def test_registration_not_completed_within_the_grace_period(node, tmp_path, grace, status):
    unregistered = node(board(tmp_path, {"state": "in_progress"}), fabric_registration_grace=grace).run(1)
    assert set(unregistered.statuses().values()) == {status}
    if status == CRITICAL:
        assert "not registered with its NVLink fabric (state: in progress)" in reasons(unregistered, 0)


def test_a_failed_registration_is_critical_at_once(node, tmp_path):
    failed = node(board(tmp_path, faults=[{"at": 0, "kind": "fabric_lost", "device": 3,
                                           "status": "NVML_ERROR_RESET_REQUIRED"}])).run(1)
    assert failed.health()[3].status == CRITICAL
    assert "NVLink fabric registration failed (" in reasons(failed, 3)
    assert failed.values("fabric.state")[3] == 3


@pytest.mark.parametrize("fabric, status, reason", [
    ({"health": {"degraded_bandwidth": True}}, WARNING, "NVLink fabric: bandwidth degraded"),
    ({"health": {"route_recovery": True}}, WARNING, "NVLink fabric: route recovery in progress"),
    ({"health": {"route_unhealthy": True}}, WARNING, "NVLink fabric: a route is unhealthy"),
    ({"health": {"access_timeout_recovery": True}}, WARNING, "NVLink fabric: recovering from an access timeout"),
    ({"summary": "limited_capacity"}, WARNING, "NVLink fabric runs at limited capacity"),
    ({"summary": "unhealthy"}, CRITICAL, "NVLink fabric health is unhealthy"),
])
def test_fabric_health(node, tmp_path, fabric, status, reason):
    degraded = node(board(tmp_path, fabric)).run(1)
    assert set(degraded.statuses().values()) == {status}
    assert reason in reasons(degraded, 0)


def test_values_outside_nvml_enums_are_not_trusted(node, tmp_path):
    garbage = node(board(tmp_path, {"state": 7, "summary": 9})).run(1)
    assert garbage.values("fabric.state") == {}
    assert garbage.values("fabric.health.summary") == {}
    assert garbage.health()[0].status == WARNING
    assert "NVLink fabric registration state 7 is not one NVML defines: not trusted" in reasons(garbage, 0)
    assert "health summary 9" in reasons(garbage, 0)


def test_the_pcie_link_is_read_again_only_after_it_retrained(node):
    """What pays for the fabric call: NVML counts the link's trips through Recovery, which any change
    of its speed or width takes; the generation and width are asked again only when that count moves."""
    faults = node("faults").run_until(15)
    faults.sim.calls.clear()
    faults.run_until(60)  # GPU 0 retrains at Gen4 x8 at t=50 (scenario faults); no other link does
    assert faults.values("pcie.link.generation")[0] == 4
    assert faults.sim.calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 1


@pytest.mark.parametrize("configuration, words", [
    ("incorrect_sysguid", "wrong system GUID"),
    ("incorrect_chassis_sn", "wrong chassis serial number"),
    ("no_partition", "no fabric partition"),
    ("insufficient_nvlinks", "too few NVLinks"),
    ("incompatible_gpu_fw", "GPU firmware incompatible with the fabric"),
    ("invalid_location", "invalid GPU location"),
    ("gpu_state_invalid", "GPU state invalid"),
])
def test_an_incorrect_configuration_is_critical_and_named(node, tmp_path, configuration, words):
    wrong = node(board(tmp_path, {"health": {"incorrect_configuration": configuration}})).run(1)
    assert set(wrong.statuses().values()) == {CRITICAL}
    assert reasons(wrong, 0) == (f"NVLink fabric configuration incorrect ({words}): CUDA work cannot use this GPU; "
                                 "check nvidia-fabricmanager and its log on this node")
    assert wrong.values("fabric.state")[0] == 3  # registered, yet wrongly configured


def test_a_configuration_fault_comes_and_goes_with_its_fault(node, tmp_path):
    faults = [{"at": 20, "kind": "fabric_lost", "device": 2, "duration": 20, "status": "NVML_ERROR_RESET_REQUIRED",
               "incorrect_configuration": "insufficient_nvlinks"}]
    b200 = node(board(tmp_path, faults=faults)).run(1)
    assert set(b200.statuses().values()) == {OK}
    b200.run_until(30)
    assert b200.health()[2].status == CRITICAL
    assert "NVLink fabric registration failed (" in reasons(b200, 2)
    assert "); configuration incorrect (too few NVLinks): CUDA work" in reasons(b200, 2)
    assert set(b200.statuses().values()) == {OK, CRITICAL}
    b200.run_until(45)
    assert set(b200.statuses().values()) == {OK}


def test_a_configuration_value_outside_the_enum_is_not_trusted(node, tmp_path):
    garbage = node(board(tmp_path, {"health": {"incorrect_configuration": 12}})).run(1)
    assert garbage.health()[0].status == WARNING
    assert reasons(garbage, 0) == "NVLink fabric health field incorrect configuration 12 is not one NVML defines: " \
                                  "not trusted"


def test_a_driver_before_r580_reports_no_configuration(node, tmp_path):
    # R570 answers v2, whose health mask has no incorrect configuration field: it reads NOT_SUPPORTED.
    old = node(board(tmp_path, {"health": {"incorrect_configuration": "gpu_state_invalid"}}, driver="570.133.20"))
    assert set(old.run(1).statuses().values()) == {OK}
