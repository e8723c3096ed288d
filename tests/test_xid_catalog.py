"""The XID catalog: every code of NVIDIA's catalog, each with a meaning, an origin, an action and a
severity from closed sets; and events, tags and health that follow it, unknown codes included."""

import pytest
import yaml
from datadog_checks.base import AgentCheck

from gpu_monitoring.health import xid
from gpu_monitoring.simulator.scenario import resolve
from gpu_monitoring.status import Status

from .conftest import H100_PCIE_NODE, tag_dict

ORIGINS = {"application", "driver", "firmware", "memory", "nvlink", "bus", "power_thermal", "hardware"}
ACTIONS = {"none", "investigate", "restart_app", "restart_vm", "update_software", "check_mechanicals",
           "follow_recovery_action", "reset_gpu", "reboot_node", "check_link", "reset_if_uvm_or_vgpu",
           "restart_fabric_manager", "contact_support"}
# The action only XID 45 takes, where it comes alone on an NVSwitch system (xid.in_context).
IN_CONTEXT = {"restart_fabric_manager"}
# NVIDIA's catalog for Ampere and later GPUs (docs.nvidia.com/deploy/xid-errors) lists codes 1 to 172.
NVIDIA_CODES = set(range(1, 173))
# The codes the package, its assets and its tests name, with the action and severity they keep.
ANCHORS = {
    13: ("restart_app", "warning"), 31: ("restart_app", "warning"), 48: ("reset_gpu", "critical"),
    62: ("reset_gpu", "critical"), 63: ("none", "ok"), 64: ("reset_gpu", "critical"),
    68: ("restart_app", "warning"), 69: ("restart_app", "warning"), 74: ("check_link", "critical"),
    79: ("reboot_node", "critical"), 92: ("investigate", "ok"), 94: ("restart_app", "warning"),
    95: ("reset_gpu", "critical"), 109: ("reset_gpu", "critical"), 119: ("reset_gpu", "critical"),
    120: ("reset_gpu", "critical"), 140: ("reset_gpu", "critical"), 143: ("reset_gpu", "critical"),
    154: ("follow_recovery_action", "ok"), 156: ("reset_gpu", "critical"),
    # NVIDIA's catalog: the GPU stays healthy (43), or it follows the XID it comes with (45).
    43: ("investigate", "ok"), 45: ("none", "ok"),
    # NVIDIA's catalog: an injected error (IGNORE, then CONTACT_SUPPORT), link training failed (RESET_GPU).
    14: ("investigate", "ok"), 136: ("reset_gpu", "critical"),
}


def test_every_code_of_nvidias_catalog_is_listed_once():
    listed = [entry["code"] for entry in yaml.safe_load(xid.CATALOG_PATH.read_text())["codes"]]
    assert len(listed) == len(set(listed)) > 100
    assert set(xid.CATALOG) == set(listed) >= NVIDIA_CODES


def test_every_field_takes_a_value_of_its_closed_set():
    assert set(xid.ORIGINS) == ORIGINS and set(xid.ADVICE) == ACTIONS
    for code, entry in xid.CATALOG.items():
        assert entry.code == code
        assert entry.meaning and entry.meaning != "unknown", code
        assert entry.origin in ORIGINS, code
        assert entry.action in ACTIONS, code
        assert entry.status in (Status.OK, Status.WARNING, Status.CRITICAL), code


def test_every_severity_is_a_health_status_and_every_action_has_advice():
    assert {severity: status.name for severity, status in xid.SEVERITIES.items()} == {
        "ok": "OK", "warning": "WARNING", "critical": "CRITICAL"}
    for action, advice in xid.ADVICE.items():
        assert advice.endswith(".") and len(advice) > 40, action


def test_every_action_is_given_to_some_code():
    assert {entry.action for entry in xid.CATALOG.values()} == ACTIONS - IN_CONTEXT


def test_the_codes_the_package_names_keep_their_action_and_severity():
    assert {code: (xid.describe(code).action, xid.describe(code).severity) for code in ANCHORS} == ANCHORS
    assert xid.describe(154).meaning == "GPU recovery action changed"
    assert xid.describe(79).origin == "bus" and "fallen off the bus" in xid.describe(79).meaning


def test_an_unknown_code_is_described_as_unknown():
    unknown = xid.describe(999)
    assert (unknown.code, unknown.meaning, unknown.origin) == (999, "unknown", "unknown")
    assert (unknown.action, unknown.status) == ("investigate", Status.OK)
    assert unknown.advice == xid.ADVICE["investigate"]


@pytest.mark.parametrize("entry, problem", [
    ("{code: 13, meaning: again, origin: application, action: restart_app, severity: warning}", "code listed twice"),
    ("{code: 2, meaning: x, origin: cosmic, action: none, severity: ok}", "origin 'cosmic'"),
    ("{code: 2, meaning: x, origin: driver, action: pray, severity: ok}", "action 'pray'"),
    ("{code: 2, meaning: x, origin: driver, action: none, severity: fatal}", "severity 'fatal'"),
    ("{code: 2, meaning: x, origin: driver, action: none}", "fields"),
    ("{code: -2, meaning: x, origin: driver, action: none, severity: ok}", "positive integer"),
    ("{code: 2, meaning: '', origin: driver, action: none, severity: ok}", "meaning is empty"),
])
def test_a_malformed_catalog_fails_to_load(tmp_path, entry, problem):
    path = tmp_path / "catalog.yaml"
    path.write_text("codes:\n"
                    "  - {code: 13, meaning: x, origin: application, action: restart_app, severity: warning}\n"
                    f"  - {entry}\n")
    with pytest.raises(ValueError, match=problem):
        xid.load(path)


NEW_CODES = H100_PCIE_NODE + """
devices:
  - {model: h100, load: {utilization: 50}}
  - {model: h100, load: {utilization: 50}}
  - {model: h100, load: {utilization: 50}}
  - {model: h100, load: {utilization: 50}}
faults:
  - {at: 5, kind: xid, device: 0, xid: 149}
  - {at: 5, kind: xid, device: 0, xid: 154}
  - {at: 5, kind: xid, device: 1, xid: 999}
  - {at: 5, kind: xid, device: 2, xid: 54}
  - {at: 5, kind: xid, device: 3, xid: 46}
"""


@pytest.fixture
def new_codes(node, tmp_path):
    scenario = tmp_path / "new-codes.yaml"
    scenario.write_text(NEW_CODES)
    subject = node(scenario)
    subject.run_until(15)
    return subject


def test_health_follows_the_catalog(new_codes):
    health = new_codes.health()
    assert new_codes.statuses() == {0: AgentCheck.WARNING, 1: AgentCheck.OK, 2: AgentCheck.WARNING,
                                    3: AgentCheck.CRITICAL}
    # 154 only says the recovery action changed (OK); the NVLink error it came with is the reason.
    assert health[0].message == f"XID 149 (NVLink network interface (NETIR) error or link down): " \
                                f"{xid.ADVICE['follow_recovery_action']}"
    assert not health[1].message
    assert health[2].message.startswith("XID 54 (Auxiliary power not connected")
    assert health[3].message.startswith("XID 46 (GPU stopped processing (GPU timeout)): Drain the GPU's workloads")


def test_events_and_counts_carry_the_catalogs_origin_and_action(new_codes, aggregator):
    events = {tag_dict(e["tags"])["xid"]: e for e in aggregator.events}
    assert set(events) == {"149", "154", "999", "54", "46"}
    # An unknown code is counted and sent like any other, as unknown.
    assert events["999"]["msg_title"] == "XID 999 on GPU 1 (NVIDIA H100 PCIe): unknown"
    assert events["999"]["msg_text"].startswith("NVIDIA XID 999 (unknown, origin: unknown) on GPU 1")
    assert {code: e["alert_type"] for code, e in events.items()} == {
        "149": "warning", "154": "info", "999": "info", "54": "warning", "46": "error"}
    counts = {}
    for stub in new_codes.series("xid_errors"):
        tags = tag_dict(stub.tags)
        counts[tags["xid"]] = (tags["xid_origin"], tags["xid_action"], stub.value)
    assert counts == {
        "149": ("nvlink", "follow_recovery_action", 1), "154": ("driver", "follow_recovery_action", 1),
        "999": ("unknown", "investigate", 1), "54": ("power_thermal", "check_mechanicals", 1),
        "46": ("driver", "reset_gpu", 1),
    }


# --- what NVIDIA's catalog says of particular codes ---------------------------------------------

def test_159_asks_for_a_reset_only_where_uvm_or_vgpu_is_in_use():
    # NVIDIA's catalog: CHECK_UVM, reset if UVM or vGPU is in use, else ignore; any C2C-linked GPU may report it.
    entry = xid.describe(159)
    assert (entry.action, entry.severity) == ("reset_if_uvm_or_vgpu", "warning")
    assert entry.action not in xid.HELD_ACTIONS
    assert "Reset the GPU" in entry.advice and "UVM" in entry.advice and "vGPU" in entry.advice
    assert "otherwise nothing needs doing" in entry.advice and "NVLink-C2C" in entry.advice


@pytest.mark.parametrize("code", [157, 165])
def test_codes_workloads_outlive_say_so(code):
    # NVIDIA's catalog: 157 IGNORE then CONTACT_SUPPORT, "you may still run workloads"; 165 power
    # smoothing off, power swings occur, replace the GPU if they are not acceptable.
    entry = xid.describe(code)
    assert (entry.action, entry.severity) == ("investigate", "warning")
    assert "Workloads may go on running" in entry.advice
    assert "not expected" not in entry.advice.lower()


def test_157_and_165_say_what_they_cost():
    assert "may raise the same XID again" in xid.describe(157).advice
    assert "power swings" in xid.describe(165).advice and "replace the GPU" in xid.describe(165).advice


def test_a_support_case_is_not_told_the_code_is_unexpected():
    # 142 (NVENC3, GB200) is raised where it applies: NVIDIA's catalog asks for CONTACT_SUPPORT.
    entry = xid.describe(142)
    assert (entry.action, entry.meaning) == ("contact_support", "Video encoder 3 exception")
    assert "not expected" not in entry.advice.lower() and "nvidia-bug-report.sh" in entry.advice


def test_14_136_60_68_and_110_follow_nvidias_catalog():
    assert "injected" in xid.describe(14).meaning.lower()
    assert xid.describe(136).action in xid.HELD_ACTIONS
    assert xid.describe(60).meaning == "Video processor exception"
    assert xid.describe(68).meaning == "Video decoder 0 exception"
    advice = xid.describe(110).advice
    assert advice.startswith(xid.ADVICE["reset_gpu"])
    assert "revert any recent hardware change" in advice and "cold-reset" in advice


def test_a_note_must_say_something(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text("codes:\n  - {code: 2, meaning: x, origin: driver, action: none, severity: ok, note: ''}\n")
    with pytest.raises(ValueError, match="note is empty"):
        xid.load(path)


def board_with_xids(tmp_path, faults):
    """A copy of hgx-b200 (every GPU registered with its NVLink fabric) with only these faults."""
    scenario = yaml.safe_load(resolve("hgx-b200").read_text())
    scenario["faults"] = faults
    path = tmp_path / "board-xids.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return path


def test_45_alone_on_an_nvswitch_system_asks_for_a_fabric_manager_restart(node, tmp_path, aggregator):
    b200 = node(board_with_xids(tmp_path, [
        {"at": 5, "kind": "xid", "device": 0, "xid": 45},
        {"at": 5, "kind": "xid", "device": 1, "xid": 45},
        {"at": 5, "kind": "xid", "device": 1, "xid": 13},
    ])).run_until(15)
    health = b200.health()
    assert health[0].status == AgentCheck.WARNING
    assert health[0].message == f"XID 45 ({xid.describe(45).meaning}): {xid.ADVICE['restart_fabric_manager']}"
    # With XID 13 on the same GPU, XID 45 is its cleanup: 13's advice is the one reason.
    assert health[1].status == AgentCheck.WARNING
    assert health[1].message.startswith("XID 13 (") and "XID 45" not in health[1].message
    events = {(tag_dict(e["tags"])["gpu_index"], tag_dict(e["tags"])["xid"]): e for e in aggregator.events}
    assert "systemctl restart nvidia-fabricmanager" in events[("0", "45")]["msg_text"]
    assert events[("0", "45")]["alert_type"] == "warning"
    assert xid.ADVICE["none"] in events[("1", "45")]["msg_text"]
    assert events[("1", "45")]["alert_type"] == "info"


def test_45_alone_without_an_nvlink_fabric_asks_for_nothing(node, tmp_path):
    scenario = tmp_path / "pcie-45.yaml"
    scenario.write_text(H100_PCIE_NODE + "devices:\n  - {model: h100, load: {utilization: 50}}\n"
                        "faults:\n  - {at: 5, kind: xid, device: 0, xid: 45}\n")
    pcie = node(scenario).run_until(15)
    assert pcie.statuses() == {0: AgentCheck.OK}


def test_45_that_is_ignored_asks_for_nothing(node, tmp_path):
    b200 = node(board_with_xids(tmp_path, [{"at": 5, "kind": "xid", "device": 0, "xid": 45}]),
                xid_ignore=[45]).run_until(15)
    assert b200.statuses()[0] == AgentCheck.OK
