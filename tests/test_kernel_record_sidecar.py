"""The kernel's record through a real sidecar: an XID raised while the sidecar was down is learnt from
the kernel's log when it comes back, every XID is counted once whichever sources saw it, each with the
Slurm job whose process it hit."""

import pytest
from datadog_checks.base.stubs import aggregator as _aggregator

from .conftest import H100_PCIE_NODE, tag_dict
from .sidecar_support import SidecarProcess, sidecar_check, wait_until

TIMELINE = H100_PCIE_NODE + """
description: One H100 running one Slurm job's process, with an application XID every 30 simulated seconds.
devices:
  - {model: h100, load: {utilization: 40}, processes: [{pid: 4711, name: python, memory_mib: 20000}]}
slurm:
  jobs:
    - {id: 48213, name: llama3-pretrain, user: alice, uid: 1001, account: nlp, partition: gpu, processes: [4711]}
faults:
  - {at: 10, kind: xid, device: 0, xid: 13}
  - {at: 40, kind: xid, device: 0, xid: 31}
  - {at: 70, kind: xid, device: 0, xid: 43}
"""


@pytest.fixture
def timeline(tmp_path):
    path = tmp_path / "timeline.yaml"
    path.write_text(TIMELINE)
    return str(path)


def xids():
    """(code, job) for each XID counted, from the xid_errors series."""
    return sorted((int(tag_dict(m.tags)["xid"]), tag_dict(m.tags).get("slurm_job_id"))
                  for m in _aggregator.metrics("gpu_monitoring.xid_errors") for _ in range(int(m.value)))


def journaled(sidecar, code):
    return sum(e.code == code and e.kind == "xid" for e in sidecar.client().events(0, 1000).events)


def test_xids_around_a_sidecar_killed_and_restarted_count_once_with_their_job(tmp_path, timeline, datadog_agent):
    # 5 simulated seconds per real second: XID 13 comes after 2 s, seen by NVML and by the kernel.
    first = SidecarProcess(tmp_path, timeline, "--speed", "5").start()
    wait_until(lambda: journaled(first, 13) == 2, 20, "XID 13 never reached the journal from both sources")
    check = sidecar_check(first.socket)
    _aggregator.reset()
    assert check.run() == ""
    assert xids() == [(13, "48213")]
    first.process.kill()  # no clean stop: what it read it journaled, nothing more
    first.process.wait(timeout=20)
    # It comes back at t=50: XID 31 (t=40) was raised while it was down, XID 43 (t=70) comes after.
    second = SidecarProcess(tmp_path, timeline, "--speed", "20", "--start-at", "50").start()
    try:
        wait_until(lambda: journaled(second, 43) == 2, 20, "XID 43 never reached the journal from both sources")
        assert journaled(second, 31) == 1  # the kernel's line alone: NVML never raised its event
        assert journaled(second, 13) == 2  # journaled before the kill, not read again from the kernel
        _aggregator.reset()
        assert check.run() == ""
        assert xids() == [(31, "48213"), (43, "48213")]
        titles = sorted(event["msg_title"] for event in _aggregator.events)
        assert titles[0].startswith("XID 31 on GPU 0") and "Slurm job 48213 (python, pid 4711)" in titles[0]
        assert "NVML raised no event" in next(e["msg_text"] for e in _aggregator.events if "XID 31" in e["msg_title"])
        # Restarted again, the check reads nothing twice.
        again = sidecar_check(second.socket)
        _aggregator.reset()
        assert again.run() == ""
        assert xids() == [] and _aggregator.events == []
    finally:
        second.stop()
