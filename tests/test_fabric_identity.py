"""A GPU out of its NVLink fabric for a while keeps its fabric's tags: hgx-b200's GPU 6 loses its registration
at t=40 for 20 s, and its series and health stay on the clique and cluster it was in, across a restart of the
check too, so that a monitor grouped by clique sees it go unhealthy and come back. Each change is logged once."""

import logging

from gpu_monitoring.health.fabric_identity import FabricIdentities
from gpu_monitoring.health.judge import FABRIC_IDENTITIES
from gpu_monitoring.snapshot import Device

from .conftest import tag_dict
from .test_demo_cost import scenario

FABRIC_TAGS = ("gpu_clique_id", "gpu_cluster_uuid")


def fault():
    return next(f for f in scenario("hgx-b200")["faults"] if f["kind"] == "fabric_lost")


def fabric_tags(stub):
    return {key: value for key, value in tag_dict(stub.tags).items() if key in FABRIC_TAGS}


def test_a_gpu_out_of_its_fabric_keeps_its_cliques_tags(node):
    lost = fault()
    hgx = node("hgx-b200")
    hgx.run_until(lost["at"] - 15)
    before = fabric_tags(hgx.health()[lost["device"]])
    assert set(before) == set(FABRIC_TAGS)
    seen = []
    for _ in range(4):  # through the loss and back
        hgx.run()
        stub = hgx.health()[lost["device"]]
        seen.append((stub.status, fabric_tags(stub)))
        (temperature,) = [t for t in hgx.series("temperature") if tag_dict(t.tags)["gpu_index"] == str(lost["device"])]
        assert fabric_tags(temperature) == before
    assert {status for status, _ in seen} > {hgx.check.OK}, "the loss was judged"
    assert all(tags == before for _, tags in seen)
    assert seen[-1][0] == hgx.check.OK


def test_what_a_restarted_check_reads_back_keeps_them(node):
    lost = fault()
    hgx = node("hgx-b200")
    hgx.run_until(lost["at"] - 15)
    before = fabric_tags(hgx.health()[lost["device"]])
    hgx.run_until(lost["at"] + 5)  # GPU 6 unregistered
    kept = FabricIdentities.loads(hgx.check.read_persistent_cache(FABRIC_IDENTITIES))
    out = next(Device(index=d.index, uuid=d.uuid) for d in hgx.check.source.read().devices if d.index == lost["device"])
    kept.fill([out])
    assert {"gpu_clique_id": str(out.fabric_clique_id), "gpu_cluster_uuid": out.fabric_cluster_uuid.lower()} == before


def test_each_change_of_clique_is_logged_once(caplog):
    identities = FabricIdentities()
    gpu = Device(index=6, uuid="GPU-6", fabric_clique_id=7, fabric_cluster_uuid="c1")
    caplog.set_level(logging.INFO, logger="gpu_monitoring.health.fabric_identity")
    assert identities.fill([gpu]) and not identities.fill([gpu])
    out = Device(index=6, uuid="GPU-6")
    assert not identities.fill([out]) and (out.fabric_clique_id, out.fabric_cluster_uuid) == (7, "c1")
    moved = Device(index=6, uuid="GPU-6", fabric_clique_id=8, fabric_cluster_uuid="c1")
    assert identities.fill([moved])
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and said[1].endswith("(was clique 7 of cluster c1)")
    assert FabricIdentities.loads(identities.dumps()).dumps() == identities.dumps()
    assert FabricIdentities.loads("not json").dumps() == "{}"
