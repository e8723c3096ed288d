"""Named values of a device: one batched nvmlDeviceGetFieldValues, and where a driver refuses a
field, the dedicated function that gives the same value.

Collectors ask for (name, scope) keys: scope 0 for device values, the link number for per-link
ones. Which source serves a key is learnt once per device and NVML session: a field refused
(per-entry NOT_SUPPORTED and the like) leaves the batch for good and its fallback reads it
from then on; a fallback NVML refuses is never called again (Device.ask remembers). So a
steady-state run asks each function only for what the batch could not answer.

What a run still calls per GPU besides the batch, and why no field replaces it (nvml.h has no
field for any of these; the nearest ones measure something else):
- nvmlDeviceGetClockInfo (SM, memory, graphics, video): no clock fields.
- nvmlDeviceGetUtilizationRates, nvmlDeviceGetEncoderUtilization, nvmlDeviceGetDecoderUtilization:
  engine utilization is sampled by the driver and has no field. (An H100 has no NVENC, yet its
  driver answers 0 for the encoder, and 100 for its encoder capacity, so nothing tells it apart.)
- nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetBAR1MemoryInfo: no memory-usage fields.
- nvmlDeviceGetTemperature: the temperature fields (TEMPERATURE_*_TLIMIT) are limits, not the reading.
- nvmlDeviceGetPerformanceState: no field.
- nvmlDeviceGetCurrentClocksEventReasons: the CLOCKS_EVENT_REASON_* / PERF_POLICY_* fields are
  cumulative durations, not the current reasons mask.
- nvmlDeviceGetCurrPcieLinkGeneration and ...Width: the PCIe fields are counters, not the link's
  training; but a link retrains only through the Recovery state, which NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER
  counts, so where the driver answers that field they are asked only after it moved (collectors.pcie).
- nvmlDeviceGetGpuFabricInfoV: no field; the NVLink fabric's registration and health can change at any time.
- nvmlDeviceGetMigMode: no field (IS_MIG_MODE_INDEPENDENT_MIG_QUERY_CAPABLE and IS_RESETLESS_MIG_SUPPORTED
  are capabilities); MIG mode can change while the check runs.
- nvmlGpmSampleGet and nvmlGpmMetricsGet: GPM metrics come from two samples, never from fields;
  on Hopper they give PCIe throughput too, where the byte-counter fields are 32 bits wide.
- The process queries (collectors.processes): lists of processes and samples, which fields cannot carry.
Values read once a session (max clocks, PCIe max link, temperature threshold, NVLink link
count, GPM support) are not in this list.
"""

from functools import cached_property
from typing import Dict, FrozenSet, NamedTuple, Optional, Tuple

import pynvml

from . import fallbacks
from .device import Device
from .fallbacks import Reader
from .fields import FieldBatch, FieldKey, Values


class Reading(NamedTuple):
    field_id: int
    fallback: Optional[Reader] = None  # None: no function gives the value (the table says why)
    wide: bool = False  # a counter only of use in 64 bits: a 32-bit answer counts as refused


READINGS: Dict[str, Reading] = {
    "energy_mj": Reading(pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, fallbacks.energy),
    # NVML has no dedicated memory-temperature query: nvmlDeviceGetTemperature's sensors are the
    # GPU die's (GPU, GPU_MAX) and the MEM_MAX threshold is a limit; this field is the only reading.
    "memory_temperature": Reading(pynvml.NVML_FI_DEV_MEMORY_TEMP),
    # Scope 0 is NVML_POWER_SCOPE_GPU. AVERAGE, not INSTANT: it is what nvmlDeviceGetPowerUsage
    # answers on Ampere (but GA100) and later, a 1-s average, steadier than one instant for a value
    # read every 15 s. Older GPUs refuse AVERAGE and get nvmlDeviceGetPowerUsage, which gives their
    # instant power as before: the metric means the same on every GPU whichever source serves it.
    "power_mw": Reading(pynvml.NVML_FI_DEV_POWER_AVERAGE, fallbacks.power),
    # The limit in force, whoever set it (the same as nvmlDeviceGetEnforcedPowerLimit).
    "power_limit_mw": Reading(pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT, fallbacks.power_limit),
    "pcie_replay": Reading(pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, fallbacks.pcie_replay),
    # Times the PCIe link left L0 for Recovery (retraining): what tells a link's speed or width may
    # have changed. No function gives it.
    "pcie_recoveries": Reading(pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER),
    # Byte counters; the fallback is a sampled rate under other names (pcie_*_kib_per_s). A real
    # H100 on driver 580 answers them in 32 bits: at 25 GB/s they wrap six times a second.
    "pcie_tx_bytes": Reading(pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, fallbacks.pcie_throughput, wide=True),
    "pcie_rx_bytes": Reading(pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, fallbacks.pcie_throughput, wide=True),
    "ecc_corrected": Reading(pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, fallbacks.ecc_corrected),
    "ecc_uncorrected": Reading(pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, fallbacks.ecc_uncorrected),
    "remapped_correctable": Reading(pynvml.NVML_FI_DEV_REMAPPED_COR, fallbacks.remapped_rows),
    "remapped_uncorrectable": Reading(pynvml.NVML_FI_DEV_REMAPPED_UNC, fallbacks.remapped_rows),
    "remapped_pending": Reading(pynvml.NVML_FI_DEV_REMAPPED_PENDING, fallbacks.remapped_rows),
    "remapped_failed": Reading(pynvml.NVML_FI_DEV_REMAPPED_FAILURE, fallbacks.remapped_rows),
    "retired_single_bit": Reading(pynvml.NVML_FI_DEV_RETIRED_SBE, fallbacks.retired_single_bit),
    "retired_double_bit": Reading(pynvml.NVML_FI_DEV_RETIRED_DBE, fallbacks.retired_double_bit),
    "retired_pending": Reading(pynvml.NVML_FI_DEV_RETIRED_PENDING, fallbacks.retired_pending),
    "nvlink_link_count": Reading(pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, fallbacks.nvlink_link_count),
    "nvlink_crc_flit": Reading(pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, fallbacks.nvlink_crc_flit),
    "nvlink_crc_data": Reading(pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, fallbacks.nvlink_crc_data),
    "nvlink_replay": Reading(pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, fallbacks.nvlink_replay),
    "nvlink_recovery": Reading(pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, fallbacks.nvlink_recovery),
    # Per link: the scope is the link number.
    "nvlink_state": Reading(pynvml.NVML_FI_DEV_NVLINK_GET_STATE, fallbacks.nvlink_state),
    # No fallback: nvmlDeviceGetNvLinkUtilizationCounter is deprecated for these very fields (to be
    # removed in CUDA 14), and its counters count only after nvmlDeviceSetNvLinkUtilizationControl,
    # a root-only setting shared with every other tool on the node.
    "nvlink_tx_kib": Reading(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
    "nvlink_rx_kib": Reading(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
    # The driver's verdict on what the GPU needs (nvmlDeviceGpuRecoveryAction_t), from R565 on; no
    # function gives it.
    "recovery_action": Reading(pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
    # Grace's NVLink-C2C links to the CPU: the count (scope 0), then per link (the scope is the link
    # number) its status (1 active) and error counters (R575 on). No function gives them.
    "c2c_link_count": Reading(pynvml.NVML_FI_DEV_C2C_LINK_COUNT),
    "c2c_status": Reading(pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS),
    "c2c_errors_interrupt": Reading(pynvml.NVML_FI_DEV_C2C_LINK_ERROR_INTR),
    "c2c_errors_replay": Reading(pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY),
    "c2c_errors_replay_b2b": Reading(pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY_B2B),
}


LINK_COUNT: FrozenSet[FieldKey] = frozenset([("nvlink_link_count", 0)])
C2C_LINK_COUNT: FrozenSet[FieldKey] = frozenset([("c2c_link_count", 0)])


def c2c_link_count(device: Device) -> int:
    """How many C2C links the device has (0 but on Grace): one batched call, made once a session
    by the collector that asks for their per-link values."""
    batch = FieldBatch(device, _field_id, _wide)
    count = batch.read(C2C_LINK_COUNT).get(("c2c_link_count", 0), 0)
    device.forget(batch.request.query)  # not asked again this session
    return int(count)


class Readings:
    """One device's named values over an NVML session: the `wanted` keys, read by its field batch
    first, then by the fallbacks of keys the batch refused; and its NVLink link count.

    A reader serving several keys (one scope) is called once; a key it cannot answer is left out.
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        self.batch = FieldBatch(device, _field_id, _wide)
        self.wanted: FrozenSet[FieldKey] = frozenset()

    @cached_property
    def links(self) -> int:
        """How many NVLink links the device has, read once a session."""
        return int(self._read(LINK_COUNT, links=0).get(("nvlink_link_count", 0), 0))

    def read(self) -> Values:
        """This run's values of the wanted keys the device gives."""
        links = self.links
        values = self._read(self.wanted, links)
        values.timestamp_us = self.batch.timestamp_us
        values.links = links
        return values

    def _read(self, wanted: FrozenSet[FieldKey], links: int) -> Values:
        # The same set object each run: the batch's request is built again only when it changes.
        values = self.batch.read(wanted)
        for reader, scope in self._fallbacks(wanted):
            for answered, value in reader(self.device, scope, links).items():
                values.setdefault((answered, scope), value)
        return values

    def _fallbacks(self, wanted: FrozenSet[FieldKey]) -> Tuple[Tuple[Reader, int], ...]:
        """The readers (and scopes) of the wanted keys the batch will never answer, each once: worked
        out again only when the request is rebuilt (a field refused) or the call itself is refused."""
        request = self.batch.request
        call_refused = self.batch.call_refused()
        if request.fallbacks is None or request.fallbacks[0] != call_refused:
            readers = (
                (READINGS[name].fallback, scope)
                for name, scope in sorted(wanted) if self.batch.refuses((name, scope)) and READINGS[name].fallback
            )
            request.fallbacks = (call_refused, tuple(dict.fromkeys(readers)))
        return request.fallbacks[1]


def _field_id(key: FieldKey) -> int:
    return READINGS[key[0]].field_id


def _wide(key: FieldKey) -> bool:
    return READINGS[key[0]].wide
