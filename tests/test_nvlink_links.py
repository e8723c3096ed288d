"""Per-link NVLink series (tagged nvlink_port, metrics_profile full), link counts, and links past a
GPU's own count refused as a real driver refuses them."""

import pynvml
import pytest
import yaml

from gpu_monitoring.simulator.scenario import resolve

DGX_LINKS = 18
CRC_LINKS = 12  # nvml.h numbers the CRC counters' fields for links 0-11 only


def test_every_link_of_every_gpu_has_its_own_series(node):
    dgx = node("dgx-h100").run(2)
    assert dgx.values("nvlink.links.total") == dict.fromkeys(range(8), DGX_LINKS)
    assert dgx.values("nvlink.links.inactive") == dict.fromkeys(range(8), 0)
    tx = dgx.link_values("nvlink.throughput.tx")
    assert set(tx) == {(gpu, link) for gpu in range(8) for link in range(DGX_LINKS)}
    totals = dgx.values("nvlink.throughput.tx")
    for gpu in range(8):
        links = [tx[gpu, link] for link in range(DGX_LINKS)]
        assert sum(links) == pytest.approx(totals[gpu])
        if totals[gpu]:
            assert len(set(links)) > 1, "the links of a busy GPU carry different shares"
    for counter in ("replay", "recovery"):
        assert len(dgx.link_values(f"nvlink.errors.{counter}")) == 8 * DGX_LINKS
    for counter in ("crc_flit", "crc_data"):
        assert {link for _, link in dgx.link_values(f"nvlink.errors.{counter}")} == set(range(CRC_LINKS))


def test_per_link_errors_differ_and_sum_to_the_gpu_total(node, tmp_path):
    raw = yaml.safe_load(resolve("dgx-h100").read_text())
    raw["models"]["h100-sxm5"]["counters"].update(nvlink_replay=31, nvlink_recovery=2)
    raw["faults"] = [{"at": 0, "kind": "nvlink_down", "device": 0, "link": 5, "duration": 10, "count": 4}]
    path = tmp_path / "dgx-h100.yaml"
    path.write_text(yaml.safe_dump(raw))
    dgx = node(str(path)).run()
    replay = dgx.link_values("nvlink.errors.replay")
    assert sum(replay[0, link] for link in range(DGX_LINKS)) == dgx.values("nvlink.errors.replay")[0] == 35
    assert len({replay[1, link] for link in range(DGX_LINKS)}) > 1
    # The fault's errors are its own link's.
    assert replay[0, 5] >= 4


@pytest.mark.parametrize("profile", ["essential", "standard"])
def test_smaller_profiles_send_the_totals_only(node, profile):
    dgx = node("dgx-h100", metrics_profile=profile).run(2)
    assert dgx.link_values("nvlink.throughput.tx") == dgx.link_values("nvlink.errors.replay") == {}
    if profile == "standard":
        assert len(dgx.values("nvlink.throughput.tx")) == len(dgx.values("nvlink.links.inactive")) == 8
    # Per-link error counters are not asked of the driver where nothing sends them.
    asked = {field_id for _, field_id in dgx.sim.field_requests}
    assert pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY not in asked


def test_links_past_the_count_are_invalid_arguments(node):
    dgx = node("dgx-h100").run()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetNvLinkState(handle, DGX_LINKS - 1) == pynvml.NVML_FEATURE_ENABLED
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(handle, DGX_LINKS)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, pynvml.NVML_NVLINK_MAX_LINKS - 1, 0)
    answers = pynvml.nvmlDeviceGetFieldValues(handle, [(pynvml.NVML_FI_DEV_NVLINK_GET_STATE, DGX_LINKS - 1),
                                                       (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, DGX_LINKS),
                                                       (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 35)])
    assert [a.nvmlReturn for a in answers] == [pynvml.NVML_SUCCESS] + [pynvml.NVML_ERROR_INVALID_ARGUMENT] * 2
    assert dgx.values("nvlink.links.total")[0] == DGX_LINKS


def test_without_the_count_field_the_links_are_probed_to_the_first_refused(node, tmp_path):
    raw = yaml.safe_load(resolve("dgx-h100").read_text())
    raw["refused_fields"] = ["NVML_FI_DEV_NVLINK_LINK_COUNT"]
    path = tmp_path / "dgx-h100.yaml"
    path.write_text(yaml.safe_dump(raw))
    dgx = node(str(path)).run(2)
    assert dgx.values("nvlink.links.total") == dict.fromkeys(range(8), DGX_LINKS)
    # Links 0-18 of each GPU, once a session: the 19th answers INVALID_ARGUMENT.
    assert dgx.sim.calls["nvmlDeviceGetNvLinkState"] == 8 * (DGX_LINKS + 1)
    dgx.run()
    assert dgx.sim.calls["nvmlDeviceGetNvLinkState"] == 8 * (DGX_LINKS + 1)


def test_a_card_without_nvlink_refuses_its_links(node):
    node("l4-mixed").run()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(handle, 0)
