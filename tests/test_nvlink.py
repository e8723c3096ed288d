"""NVLink series from the per-link fields: every link, one link, and a driver refusing some of them."""

import pytest
import yaml

from gpu_monitoring.simulator.scenario import resolve


def dgx(tmp_path, links=18, refused=()):
    """dgx-h100 with `links` NVLinks per GPU and these field IDs refused, under the same file name
    (GPU UUIDs come from it)."""
    raw = yaml.safe_load(resolve("dgx-h100").read_text())
    raw["models"]["h100-sxm5"]["nvlink_links"] = links
    raw["refused_fields"] = list(refused)
    path = tmp_path / "dgx-h100.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize("links", [18, 1])
def test_links_are_counted_and_their_throughput_summed(node, tmp_path, links):
    simulated = node(dgx(tmp_path, links)).run(3)
    assert set(simulated.values("nvlink.links.active").values()) == {links}
    throughput = simulated.values("nvlink.throughput.tx")
    assert len(throughput) == 8 and max(throughput.values()) > 0


def test_a_driver_refusing_per_link_throughput_still_tells_the_links(node, tmp_path):
    simulated = node(dgx(tmp_path, refused=["NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"])).run(3)
    assert set(simulated.values("nvlink.links.active").values()) == {18}
    assert simulated.values("nvlink.throughput.tx") == simulated.values("nvlink.throughput.rx") == {}
