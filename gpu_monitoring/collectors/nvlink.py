"""NVLink state, throughput and error counters, per GPU and per link, all from the batched field values."""

import functools
from operator import itemgetter
from typing import Dict, List, Tuple

from gpu_monitoring.collectors.base import Collector, CounterRates, Fields, from_fields
from gpu_monitoring.collectors.series import Series, SeriesValue, fact, gauge, monotonic_count
from gpu_monitoring.metrics.names import (
    NVLINK_BER_EFFECTIVE,
    NVLINK_BER_SYMBOL,
    NVLINK_ERRORS_CRC_DATA,
    NVLINK_ERRORS_CRC_FLIT,
    NVLINK_ERRORS_EFFECTIVE,
    NVLINK_ERRORS_FEC,
    NVLINK_ERRORS_RECOVERY,
    NVLINK_ERRORS_REPLAY,
    NVLINK_LINKS_ACTIVE,
    NVLINK_LINKS_INACTIVE,
    NVLINK_LINKS_TOTAL,
    NVLINK_THROUGHPUT_RX,
    NVLINK_THROUGHPUT_TX,
)
from gpu_monitoring.metrics.profile import EVERYTHING, Profile
from gpu_monitoring.metrics.spec import SPEC
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.fields import FieldKey
from gpu_monitoring.nvml.readings import CRC_LINKS, FEC_BINS, field

# nvml.h: NVML_NVLINK_STATE_INACTIVE 0, _ACTIVE 1, _SLEEP 2 (a link asleep to save power is up).
INACTIVE, ACTIVE, SLEEP = 0, 1, 2
UP = (ACTIVE, SLEEP)

ERRORS = {
    field("nvlink_crc_flit"): monotonic_count(NVLINK_ERRORS_CRC_FLIT),
    field("nvlink_crc_data"): monotonic_count(NVLINK_ERRORS_CRC_DATA),
    field("nvlink_replay"): monotonic_count(NVLINK_ERRORS_REPLAY),
    field("nvlink_recovery"): monotonic_count(NVLINK_ERRORS_RECOVERY),
}
# Per-link counters (readings) by metric; the CRC ones exist for the links nvml.h numbers fields for.
LINK_ERRORS = {
    "nvlink_link_replay": NVLINK_ERRORS_REPLAY,
    "nvlink_link_recovery": NVLINK_ERRORS_RECOVERY,
    "nvlink_link_crc_flit": NVLINK_ERRORS_CRC_FLIT,
    "nvlink_link_crc_data": NVLINK_ERRORS_CRC_DATA,
}
CRC_BY_LINK = ("nvlink_link_crc_flit", "nvlink_link_crc_data")
# NVLink 5, per link and for the GPU: the GPU's effective errors are its links' sum, its BERs the worst link's.
NVLINK5 = {
    "nvlink_effective_errors": (monotonic_count(NVLINK_ERRORS_EFFECTIVE), sum),
    "nvlink_effective_ber": (gauge(NVLINK_BER_EFFECTIVE), max),
    "nvlink_symbol_ber": (gauge(NVLINK_BER_SYMBOL), max),
}
FEC = tuple(f"nvlink_fec_{n}" for n in range(FEC_BINS))
LINKS_TOTAL = gauge(NVLINK_LINKS_TOTAL)
LINKS_ACTIVE = gauge(NVLINK_LINKS_ACTIVE)
LINKS_INACTIVE = gauge(NVLINK_LINKS_INACTIVE)
LINK_STATES = fact("nvlink_states")
THROUGHPUT = (gauge(NVLINK_THROUGHPUT_TX), gauge(NVLINK_THROUGHPUT_RX))


class NvLink(Collector):
    """Throughput is the rate of NVML's per-link KiB counters between two runs. Per-link series are
    read only where the metrics profile sends them; the links' states always (health judges them)."""

    name = "nvlink"

    def __init__(self, profile: Profile = EVERYTHING) -> None:
        super().__init__(profile)
        self._rates = CounterRates()
        # Which groups of reads the profile sends something of.
        self._wanted = {
            "link_throughput": self.wants(link_series(NVLINK_THROUGHPUT_TX, 0)),
            "link_errors": self.wants(link_series(NVLINK_ERRORS_REPLAY, 0)),
            "nvlink5": any(self.wants(s) or self.wants(link_series(s.name, 0)) for s, _ in NVLINK5.values()),
            "link_nvlink5": self.wants(link_series(NVLINK_ERRORS_EFFECTIVE, 0)),
            "fec": self.wants(fec_series(0)),
        }

    def fields(self, device: NvmlDevice, links: int):
        if not links:
            return []
        keys = _keys(links)
        names = ["nvlink_state", "nvlink_tx_kib", "nvlink_rx_kib"]
        names += list(LINK_ERRORS) if self._wanted["link_errors"] else []
        names += list(NVLINK5) if self._wanted["nvlink5"] else []
        names += list(FEC) if self._wanted["fec"] else []
        return [key for name in names for key in keys[name]] + list(ERRORS)

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        links = fields.links
        if not links:
            return []
        keys = _keys(links)
        found = from_fields(fields, ERRORS) + self._states(fields, keys["nvlink_state"], links)
        found += self._throughput(device, fields, keys)
        wanted = self._wanted
        if wanted["link_errors"]:
            found += [(series, fields[key]) for name, metric in LINK_ERRORS.items()
                      for series, key in zip(links_series(metric, links), keys[name]) if key in fields]
        if wanted["nvlink5"]:
            found += _nvlink5(fields, keys, links, wanted["link_nvlink5"])
        if wanted["fec"]:
            found += _fec(fields, keys)
        return found

    @staticmethod
    def _states(fields: Fields, keys: Tuple[FieldKey, ...], links: int) -> List[SeriesValue]:
        # A link the driver did not answer for is None: health neither trusts nor blames it.
        states = [None if key not in fields else int(fields[key]) for key in keys]
        found: List[SeriesValue] = [(LINKS_TOTAL, links)]
        if any(state is not None for state in states):
            found += [(LINK_STATES, states),
                      (LINKS_ACTIVE, sum(1 for state in states if state in UP)),
                      (LINKS_INACTIVE, states.count(INACTIVE))]
        return found

    def _throughput(
        self, device: NvmlDevice, fields: Fields, keys: Dict[str, Tuple[FieldKey, ...]]
    ) -> List[SeriesValue]:
        tx, rx = _every_link(fields, keys["nvlink_tx_kib"]), _every_link(fields, keys["nvlink_rx_kib"])
        if not (tx and rx):
            return []
        rates = self._rates.update(device.index, fields.timestamp_us, tuple(kib * 1024.0 for kib in tx + rx))
        if rates is None:
            return []
        links = len(tx)
        found: List[SeriesValue] = [(THROUGHPUT[0], sum(rates[:links])), (THROUGHPUT[1], sum(rates[links:]))]
        if self._wanted["link_throughput"]:
            found += [pair for series, half in zip(THROUGHPUT, (rates[:links], rates[links:]))
                      for pair in zip(links_series(series.name, links), half)]
        return found

    def forget(self) -> None:
        self._rates.forget()


def _nvlink5(fields: Fields, keys: Dict[str, Tuple[FieldKey, ...]], links: int, per_link: bool) -> List[SeriesValue]:
    """What a field the driver refuses (any GPU before NVLink 5) gives: nothing."""
    found: List[SeriesValue] = []
    for name, (series, aggregate) in NVLINK5.items():
        answered = [(link, fields[key]) for link, key in enumerate(keys[name]) if key in fields]
        if not answered:
            continue
        # A sum over some links only would fall and rise again, which reads as a counter reset.
        if aggregate is max or len(answered) == links:
            found.append((series, aggregate(value for _, value in answered)))
        if per_link:
            found += [(link_series(series.name, link), value) for link, value in answered]
    return found


def _fec(fields: Fields, keys: Dict[str, Tuple[FieldKey, ...]]) -> List[SeriesValue]:
    """Each FEC history bin summed over the GPU's links: the histogram's shape tells a degrading GPU,
    and its links' effective BER and errors say which link. Per link and bin it would be 16 series a
    link (288 a GPU of 18 links) for what those already tell. A bin some link did not answer is left
    out: a sum over fewer links would read as a counter reset."""
    sums = (_every_link(fields, keys[name]) for name in FEC)
    return [(fec_series(n), sum(values)) for n, values in enumerate(sums) if values]


@functools.cache
def link_series(name: str, link: int) -> Series:
    """A metric's series of one link, made once."""
    return (monotonic_count if SPEC[name].type == "monotonic_count" else gauge)(name, (f"nvlink_port:{link}",))


@functools.cache
def links_series(name: str, links: int) -> Tuple[Series, ...]:
    """A metric's series of each of `links` links, in link order: a run pairs them with its values."""
    return tuple(link_series(name, link) for link in range(links))


@functools.cache
def fec_series(fec_bin: int) -> Series:
    return monotonic_count(NVLINK_ERRORS_FEC, (f"fec_bin:{fec_bin}",))


@functools.cache
def _keys(links: int) -> Dict[str, Tuple[FieldKey, ...]]:
    """The per-link keys of each per-link reading for this many links, made once."""
    per_link = ("nvlink_state", "nvlink_tx_kib", "nvlink_rx_kib", *LINK_ERRORS, *NVLINK5, *FEC)
    keys = {name: tuple(field(name, link) for link in range(links)) for name in per_link if name not in CRC_BY_LINK}
    # Each link's CRC counters have a field of their own, links 0-11 (nvml.CRC_LINKS).
    for name in CRC_BY_LINK:
        keys[name] = tuple(field(f"{name}_{link}", link) for link in range(min(links, CRC_LINKS)))
    return keys


def _every_link(fields: Fields, keys: Tuple[FieldKey, ...]) -> Tuple[float, ...]:
    """The value of every link, in link order; empty unless the fields answered all of them."""
    try:
        values = itemgetter(*keys)(fields)
    except KeyError:
        return ()
    return values if len(keys) > 1 else (values,)  # one key: itemgetter gives the value itself
