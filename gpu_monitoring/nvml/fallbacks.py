"""The dedicated NVML functions that give what field values give, for drivers that refuse the fields.

A reader takes a device, a scope (0, or the link number of a per-link value) and the device's
NVLink link count, and returns what it read by value name, nothing where the device cannot
answer; one call may serve several names (nvmlDeviceGetRemappedRows gives four). Readers ask
through NvmlDevice.ask, so a function NVML refuses for good is not called again, and GpuLost goes
up as from any other call.
"""

import ctypes
import functools
from typing import Any, Callable, Dict

import pynvml

from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.library import Call, Filling, Query, scalar

Reader = Callable[[NvmlDevice, int, int], Dict[str, float]]
# What the PCIe byte counters' fallback gives: a sampled rate, under names of its own.
SAMPLED_PCIE = ("pcie_tx_kib_per_s", "pcie_rx_kib_per_s")


def _single(name: str, call: Call) -> Reader:
    def reader(device: NvmlDevice, scope: int, links: int) -> Dict[str, float]:
        value = device.ask(call)
        return {} if value is None else {name: value}

    return reader


energy = _single("energy_mj", scalar("nvmlDeviceGetTotalEnergyConsumption", output=ctypes.c_ulonglong))
power = _single("power_mw", scalar("nvmlDeviceGetPowerUsage"))
power_limit = _single("power_limit_mw", scalar("nvmlDeviceGetEnforcedPowerLimit"))
pcie_replay = _single("pcie_replay", scalar("nvmlDeviceGetPcieReplayCounter"))
ecc_corrected = _single("ecc_corrected", scalar(
    "nvmlDeviceGetTotalEccErrors", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC,
    output=ctypes.c_ulonglong))
ecc_uncorrected = _single("ecc_uncorrected", scalar(
    "nvmlDeviceGetTotalEccErrors", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC,
    output=ctypes.c_ulonglong))


def _retired_pages(cause: int) -> Filling:
    """How many pages are retired for `cause`, which is what the fields give: one call with room for
    their addresses (pynvml's binding would ask twice, the second time for the addresses)."""
    as_c = ctypes.c_uint(cause)

    def arrange(count: Any, addresses: Any) -> tuple:
        return as_c, count, addresses

    return Filling("nvmlDeviceGetRetiredPages", ctypes.c_ulonglong, arrange, len, key_args=(cause,))


retired_single_bit = _single(
    "retired_single_bit", _retired_pages(pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS))
retired_double_bit = _single(
    "retired_double_bit", _retired_pages(pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
retired_pending = _single("retired_pending", scalar("nvmlDeviceGetRetiredPagesPendingStatus"))

_REMAPPED_ROWS = Query("nvmlDeviceGetRemappedRows", [ctypes.c_uint] * 4, lambda *rows: [row.value for row in rows])


def remapped_rows(device: NvmlDevice, scope: int, links: int) -> Dict[str, float]:
    rows = device.ask(_REMAPPED_ROWS)
    if rows is None:
        return {}
    correctable, uncorrectable, pending, failed = rows
    return {"remapped_correctable": correctable, "remapped_uncorrectable": uncorrectable,
            "remapped_pending": pending, "remapped_failed": failed}


def pcie_throughput(device: NvmlDevice, scope: int, links: int) -> Dict[str, float]:
    """The sampled rate: not the byte counters the fields give, so under names of its own for the
    collector to tell apart."""
    return dict(zip(SAMPLED_PCIE, device.sampled_pcie_throughput() or ()))


# One query per link (and counter), made when first asked: up to NVML_NVLINK_MAX_LINKS of each.
@functools.cache
def _link_state(link: int) -> Query:
    return scalar("nvmlDeviceGetNvLinkState", link)


@functools.cache
def _link_errors(link: int, counter: int) -> Query:
    return scalar("nvmlDeviceGetNvLinkErrorCounter", link, counter, output=ctypes.c_ulonglong)


def nvlink_state(device: NvmlDevice, link: int, links: int) -> Dict[str, float]:
    state = device.ask(_link_state(link))
    return {} if state is None else {"nvlink_state": state}


def nvlink_link_count(device: NvmlDevice, scope: int, links: int) -> Dict[str, float]:
    """Links are numbered from 0: the count is how many answer nvmlDeviceGetNvLinkState before the
    first the driver rejects: INVALID_ARGUMENT past the GPU's own count (a GB200 has 18 links, while
    NVML_NVLINK_MAX_LINKS is 36), NOT_SUPPORTED on a GPU without NVLink (one call). Read once a
    session (Readings.links)."""
    found = 0
    while found < pynvml.NVML_NVLINK_MAX_LINKS and device.ask(_link_state(found)) is not None:
        found += 1
    return {"nvlink_link_count": found}


def _nvlink_errors(name: str, counter: int) -> Reader:
    """The device's total of one error counter, as its `*_TOTAL` field gives it: the sum over its links."""

    def reader(device: NvmlDevice, scope: int, links: int) -> Dict[str, float]:
        answered = []
        for link in range(links):
            query = _link_errors(link, counter)
            count = device.ask(query)
            if count is not None:
                answered.append(count)
            elif not device.refuses(query):
                # A link that never counts is left out; one that failed this time fails the total,
                # which would otherwise drop and come back, and read as a counter reset.
                return {}
        return {name: sum(answered)} if answered else {}

    return reader


nvlink_crc_flit = _nvlink_errors("nvlink_crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
nvlink_crc_data = _nvlink_errors("nvlink_crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)
nvlink_replay = _nvlink_errors("nvlink_replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY)
nvlink_recovery = _nvlink_errors("nvlink_recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)

# Every function the readers above call: what a run spends on values whose fields the driver refused.
FUNCTIONS = frozenset({
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter",
})
