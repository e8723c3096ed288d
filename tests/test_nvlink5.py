"""NVLink 5 counters (Blackwell): effective errors, effective and symbol BER, FEC history, per link
and per GPU, on a test board of two GPUs; a GPU before NVLink 5 refuses them once and sends none."""

from pathlib import Path

import pynvml
import pytest

from gpu_monitoring.nvml.readings import decode_ber

from .test_nvlink_health import nvlink_reasons

BOARD = str(Path(__file__).parent / "data" / "nvlink5-board.yaml")
LINKS = 18
NVLINK5_FIELDS = {pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS, pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER,
                  pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER, pynvml.NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_0}


@pytest.mark.parametrize("packed, rate", [(0x10F, 1e-15), (0x90D, 9e-13), (0xF0C, 1.5e-11), (0, 0.0), (0x10109, 1e-9)])
def test_a_ber_is_its_mantissa_times_ten_to_minus_its_exponent(packed, rate):
    assert decode_ber(packed) == pytest.approx(rate)


def test_every_link_and_the_gpu(node):
    board = node(BOARD).run_until(15)
    errors = board.link_values("nvlink.errors.effective")
    assert set(errors) == {(gpu, link) for gpu in range(2) for link in range(LINKS)}
    assert board.values("nvlink.errors.effective") == {gpu: sum(errors[gpu, link] for link in range(LINKS))
                                                      for gpu in range(2)}
    assert board.values("nvlink.errors.effective")[1] > 0 == board.values("nvlink.errors.effective")[0]
    for metric in ("nvlink.ber.effective", "nvlink.ber.symbol"):
        per_link = board.link_values(metric)
        assert board.values(metric) == {gpu: max(per_link[gpu, link] for link in range(LINKS)) for gpu in range(2)}
        assert all(0 < rate < 1e-8 for rate in per_link.values()), metric
    # GPU 1 counts effective errors on every link: a BER of (1 + link % 9) x 1e-13.
    assert board.link_values("nvlink.ber.effective")[1, 8] == pytest.approx(9e-13)
    # FEC history: per GPU and bin, its links summed (a link's own is told by its BER and errors).
    fec = board.keyed("nvlink.errors.fec", lambda t: (int(t["gpu_index"]), int(t["fec_bin"])))
    assert len(fec) == 2 * 16
    assert not any("nvlink_port" in tag for stub in board.series("nvlink.errors.fec") for tag in stub.tags)
    assert fec[0, 0] > fec[0, 1] > fec[0, 2]
    # NVLink 5 has no DL replay or recovery counters per link.
    assert board.link_values("nvlink.errors.replay") == board.link_values("nvlink.errors.recovery") == {}


def test_standard_sends_the_gpu_figures(node):
    board = node(BOARD, metrics_profile="standard").run(2)
    for metric in ("nvlink.errors.effective", "nvlink.ber.effective", "nvlink.ber.symbol"):
        assert len(board.values(metric)) == 2 and board.link_values(metric) == {}, metric
    assert board.series("nvlink.errors.fec") == []


def test_a_gpu_before_nvlink5_is_asked_once(node):
    dgx = node("dgx-h100").run()
    asked = {field_id: count for (_, field_id), count in dgx.sim.field_requests.items() if field_id in NVLINK5_FIELDS}
    assert set(asked) == NVLINK5_FIELDS
    dgx.run(2)
    after = {field_id: count for (_, field_id), count in dgx.sim.field_requests.items() if field_id in NVLINK5_FIELDS}
    assert after == asked
    for metric in ("nvlink.errors.effective", "nvlink.ber.effective", "nvlink.ber.symbol", "nvlink.errors.fec"):
        assert dgx.series(metric) == [], metric


def test_health_names_the_links_of_the_timeline(node):
    board = node(BOARD).run_until(15)
    assert nvlink_reasons(board) == {0: [], 1: []}
    board.run_until(30)
    assert nvlink_reasons(board)[1] == ["NVLink up but its traffic disabled: link 7"]
    board.run_until(60)
    assert nvlink_reasons(board)[1] == ["NVLink down: link 2"]
    assert board.values("nvlink.links.inactive") == {0: 0, 1: 1}
