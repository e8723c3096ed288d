"""The dedicated NVML functions that give what field values give, for drivers that refuse the fields.

A reader takes a device and a scope (0, or the link number of a per-link value) and returns
what it read by value name; one call may serve several names (nvmlDeviceGetRemappedRows gives
four). Readers go through Device.call, so a function NVML refuses for good is not called again,
and GpuLost goes up as from any other call.
"""

from typing import TYPE_CHECKING, Callable, Dict

import pynvml

from . import listing
from .errors import CannotAnswer

if TYPE_CHECKING:
    from .device import Device

Reader = Callable[["Device", int], Dict[str, float]]


def _single(name: str, function: str, *args: int) -> Reader:
    def reader(device: "Device", scope: int) -> Dict[str, float]:
        return {name: device.call(function, *args)}

    return reader


energy = _single("energy_mj", "nvmlDeviceGetTotalEnergyConsumption")
power = _single("power_mw", "nvmlDeviceGetPowerUsage")
power_limit = _single("power_limit_mw", "nvmlDeviceGetEnforcedPowerLimit")
pcie_replay = _single("pcie_replay", "nvmlDeviceGetPcieReplayCounter")
ecc_corrected = _single("ecc_corrected", "nvmlDeviceGetTotalEccErrors",
                        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)
ecc_uncorrected = _single("ecc_uncorrected", "nvmlDeviceGetTotalEccErrors",
                          pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
# The pages' count (one call, see BINDINGS), which is what the fields give, not their addresses.
retired_single_bit = _single("retired_single_bit", "nvmlDeviceGetRetiredPages",
                             pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
retired_double_bit = _single("retired_double_bit", "nvmlDeviceGetRetiredPages",
                             pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
retired_pending = _single("retired_pending", "nvmlDeviceGetRetiredPagesPendingStatus")


def remapped_rows(device: "Device", scope: int) -> Dict[str, float]:
    correctable, uncorrectable, pending, failed = device.call("nvmlDeviceGetRemappedRows")
    return {"remapped_correctable": correctable, "remapped_uncorrectable": uncorrectable,
            "remapped_pending": pending, "remapped_failed": failed}


def pcie_throughput(device: "Device", scope: int) -> Dict[str, float]:
    """KiB/s sampled over 20 ms per direction: a rate, not the byte counters the fields give, so
    under names of its own for the collector to tell apart. RX is not asked where TX is refused."""
    tx = device.call("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_TX_BYTES)
    rx = device.call("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_RX_BYTES)
    return {"pcie_tx_kib_per_s": tx, "pcie_rx_kib_per_s": rx}


def nvlink_state(device: "Device", link: int) -> Dict[str, float]:
    return {"nvlink_state": device.call("nvmlDeviceGetNvLinkState", link)}


def nvlink_link_count(device: "Device", scope: int) -> Dict[str, float]:
    """Links are numbered from 0: the count is how many answer nvmlDeviceGetNvLinkState before the
    first that does not (one call on a GPU without NVLink). Read once per session (Device.nvlink_count)."""
    links = 0
    while links < pynvml.NVML_NVLINK_MAX_LINKS:
        try:
            device.call("nvmlDeviceGetNvLinkState", links)
        except CannotAnswer:
            break
        links += 1
    return {"nvlink_link_count": links}


def _nvlink_errors(name: str, counter: int) -> Reader:
    """The device's total of one error counter, as its `*_TOTAL` field gives it: the sum over its links."""

    def reader(device: "Device", scope: int) -> Dict[str, float]:
        answered = []
        for link in range(device.nvlink_count):
            try:
                answered.append(device.call("nvmlDeviceGetNvLinkErrorCounter", link, counter))
            except CannotAnswer:
                # A link that never counts is left out; one that failed this time fails the total,
                # which would otherwise drop and come back, and read as a counter reset.
                if not device.refuses("nvmlDeviceGetNvLinkErrorCounter", link, counter):
                    raise
        if not answered:
            raise CannotAnswer(f"no link of {device!r} answers nvmlDeviceGetNvLinkErrorCounter({counter})")
        return {name: sum(answered)}

    return reader


nvlink_crc_flit = _nvlink_errors("nvlink_crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
nvlink_crc_data = _nvlink_errors("nvlink_crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)
nvlink_replay = _nvlink_errors("nvlink_replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY)
nvlink_recovery = _nvlink_errors("nvlink_recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)

# pynvml's binding would ask twice and fetch every address; the fields give only the count.
BINDINGS: Dict[str, Callable[..., int]] = {
    "nvmlDeviceGetRetiredPages": lambda handle, cause: listing.count(handle, "nvmlDeviceGetRetiredPages", cause),
}

# Every function the readers above call: what a run spends on values whose fields the driver refused.
FUNCTIONS = frozenset({
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter",
})
