"""The XID catalog: every code of NVIDIA's catalog, each with a meaning, an origin, an action and a
severity from closed sets; and events, tags and health that follow it, unknown codes included."""

import pytest
import yaml
from datadog_checks.base import AgentCheck

from gpu_monitoring import xid
from gpu_monitoring.service_checks import Status

from .conftest import H100_PCIE_NODE, tag_dict

ORIGINS = {"application", "driver", "firmware", "memory", "nvlink", "bus", "power_thermal", "hardware"}
ACTIONS = {"none", "investigate", "restart_app", "restart_vm", "update_software", "check_mechanicals",
           "follow_recovery_action", "reset_gpu", "reboot_node", "check_link", "contact_support"}
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
    assert {entry.action for entry in xid.CATALOG.values()} == ACTIONS


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
