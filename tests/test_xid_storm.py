"""An XID storm through the check: one Datadog event per GPU, code and run with the count, an exact
xid_errors count, and a bounded number of events however many GPUs and codes a run brings."""

from gpu_monitoring.health import xid
from gpu_monitoring.submission.events import MAX_EVENTS

from .conftest import H100_PCIE_NODE, tag_dict

STORM = H100_PCIE_NODE + """
devices:
  - {model: h100, load: {utilization: 50}}
  - {model: h100, load: {utilization: 50}}
faults:
  - {at: 5, kind: xid, device: 0, xid: 13, count: 5000}
  - {at: 10, kind: xid, device: 0, xid: 13, count: 1}
  - {at: 10, kind: xid, device: 1, xid: 31}
"""
GPUS = 8
# Warning and info codes on every GPU, and one critical code on two of them: 8 x 10 + 2 groups.
CODES = (8, 11, 13, 25, 31, 32, 37, 38, 39, 40)
CRITICAL = {2: 48, 5: 79}


def scenario(tmp_path, text):
    path = tmp_path / "storm.yaml"
    path.write_text(text)
    return path


def xid_counts(node):
    counts = {}
    for stub in node.series("xid_errors"):
        tags = tag_dict(stub.tags)
        key = (tags["gpu_index"], tags["xid"])
        counts[key] = counts.get(key, 0) + stub.value
    return counts


def test_a_storm_is_one_event_with_its_count(node, tmp_path, aggregator):
    storm = node(scenario(tmp_path, STORM)).run_until(15)
    assert xid_counts(storm) == {("0", "13"): 5001, ("1", "31"): 1}
    events = {tag_dict(e["tags"])["gpu_index"]: e for e in aggregator.events}
    assert len(aggregator.events) == 2
    title = "XID 13 × 5,001 on GPU 0 (NVIDIA H100 PCIe): Graphics engine exception"
    assert events["0"]["msg_title"] == title
    assert " 5,001 times from " in events["0"]["msg_text"] and " UTC to " in events["0"]["msg_text"]
    assert xid.describe(13).advice in events["0"]["msg_text"]
    assert events["1"]["msg_title"] == f"XID 31 on GPU 1 (NVIDIA H100 PCIe): {xid.describe(31).meaning}"  # no "× 1"
    assert events["0"]["aggregation_key"] != events["1"]["aggregation_key"]
    assert events["0"]["aggregation_key"].endswith(".13")
    assert storm.health()[0].message.startswith("XID 13 × 5,001 (Graphics engine exception): ")


def test_5000_xids_of_one_code_are_counted_exactly(node, tmp_path, aggregator):
    storm = node(scenario(tmp_path, STORM.replace("  - {at: 10, kind: xid, device: 0, xid: 13, count: 1}\n", "")))
    storm.run_until(15)
    assert xid_counts(storm)[("0", "13")] == 5000
    assert [e["msg_title"].split(" on ")[0] for e in aggregator.events if "xid:13" in e["tags"]] == ["XID 13 × 5,000"]


def many_codes_on_many_gpus() -> str:
    devices = "".join("  - {model: h100, load: {utilization: 50}}\n" for _ in range(GPUS))
    faults = "".join(f"  - {{at: 5, kind: xid, device: {gpu}, xid: {code}, count: 3}}\n"
                     for gpu in range(GPUS) for code in CODES)
    faults += "".join(f"  - {{at: 5, kind: xid, device: {gpu}, xid: {code}}}\n" for gpu, code in CRITICAL.items())
    return H100_PCIE_NODE + "devices:\n" + devices + "faults:\n" + faults


def test_many_codes_on_many_gpus_cost_a_bounded_number_of_events(node, tmp_path, aggregator):
    groups = GPUS * len(CODES) + len(CRITICAL)
    xids = GPUS * len(CODES) * 3 + len(CRITICAL)
    busy = node(scenario(tmp_path, many_codes_on_many_gpus())).run_until(15)
    assert sum(xid_counts(busy).values()) == xids
    assert len(xid_counts(busy)) == groups
    assert len(aggregator.events) == MAX_EVENTS + 1
    *sent, left_out = aggregator.events
    # The most severe groups are never the ones left out.
    sent_keys = {(tag_dict(e["tags"])["gpu_index"], tag_dict(e["tags"])["xid"]) for e in sent}
    assert {(str(gpu), str(code)) for gpu, code in CRITICAL.items()} <= sent_keys
    left_groups = groups - MAX_EVENTS
    assert left_out["msg_title"] == (f"{left_groups} more GPU and XID code groups "
                                     f"({xids - sum(_count(e) for e in sent)} XIDs) left out of this run's events")
    assert "gpu_monitoring.xid_errors counts every XID" in left_out["msg_text"]


def _count(event) -> int:
    """The XIDs one event stands for, from its title's `× n` (1 without)."""
    label = event["msg_title"].split(" on ")[0]
    return int(label.split(" × ")[1].replace(",", "")) if " × " in label else 1
