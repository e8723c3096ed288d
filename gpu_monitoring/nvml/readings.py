"""Named values of a device: one batched nvmlDeviceGetFieldValues, and where a driver refuses a
field, the dedicated function that gives the same value.

Collectors ask for (name, scope) keys: scope 0 for device values, the link number for per-link
ones. Which source serves a key is learnt once per device and NVML session: a field refused
(per-entry NOT_SUPPORTED and the like) leaves the batch for good and its fallback reads it
from then on; a fallback NVML refuses is never called again (NvmlDevice.ask remembers). So a
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
  are capabilities). A new mode takes effect only when the GPU is idle, so a GPU that lists processes
  is asked every few minutes, not every run (collectors.mig).
- nvmlGpmSampleGet and nvmlGpmMetricsGet: GPM metrics come from two samples, never from fields;
  on Hopper they give PCIe throughput too, where the byte-counter fields are 32 bits wide.
- The process queries (collectors.processes): lists of processes and samples, which fields cannot carry.
Values read once a session (max clocks, PCIe max link, temperature threshold, NVLink link
count, GPM support) are not in this list.
"""

from functools import cached_property
from typing import Callable, Dict, FrozenSet, NamedTuple, Optional, Tuple

import pynvml

from gpu_monitoring.nvml import fallbacks
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.fallbacks import SAMPLED_PCIE, Reader
from gpu_monitoring.nvml.fields import FieldBatch, FieldKey, Values


class Reading(NamedTuple):
    field_id: int
    fallback: Optional[Reader] = None  # None: no function gives the value (the table says why)
    wide: bool = False  # a counter only of use in 64 bits: a 32-bit answer counts as refused
    decode: Optional[Callable[[float], float]] = None  # what the answer packs, read as the value it means


# nvml.h (CUDA 13) numbers the per-link CRC counters' fields by link, for links 0-11 only (…_L0 to
# …_L5, then …_L6 to …_L11 further on); links past 11 have no such field.
def _by_link(first: int, sixth: int) -> Tuple[int, ...]:
    """Field IDs of links 0-11: links 0-5 from `first` on, links 6-11 from `sixth` on."""
    return tuple(range(first, first + 6)) + tuple(range(sixth, sixth + 6))


CRC_FLIT_BY_LINK = _by_link(pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0,
                            pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6)
CRC_DATA_BY_LINK = _by_link(pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0,
                            pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6)
# NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_0 to _15 (nvml.h: 235-250), the link in the scope.
FEC_BINS = 16


def decode_ber(packed: float) -> float:
    """A BER field's value: nvml.h packs the exponent in bits 0-7 and the mantissa in bits 8-11
    (NVML_NVLINK_BER_EXP_* and NVML_NVLINK_BER_MANTISSA_*, which pynvml lacks), the rate being
    mantissa x 10^-exponent."""
    packed = int(packed)
    return (packed >> 8 & 0xF) * 10.0 ** -(packed & 0xFF)


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
    # Lifetime (aggregate) counts kept in the InfoROM. No fallback: nvmlDeviceGetTotalEccErrors and
    # nvmlDeviceGetMemoryErrorCounter would cost a call each per run for what the batch gives.
    "ecc_corrected_aggregate": Reading(pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL),
    "ecc_uncorrected_aggregate": Reading(pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL),
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
    # Per link, the link in the scope. No fallback: nvmlDeviceGetNvLinkErrorCounter would cost a call
    # per link and counter, where these cost none. nvml.h: REPLAY and RECOVERY are unsupported on
    # Blackwell and later (NVLink 5 counts recoveries in NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*).
    "nvlink_link_replay": Reading(pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY),
    "nvlink_link_recovery": Reading(pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY),
    # One field per link (links 0-11), the link in the scope too as nvml.h asks.
    **{f"nvlink_link_crc_flit_{link}": Reading(field_id) for link, field_id in enumerate(CRC_FLIT_BY_LINK)},
    **{f"nvlink_link_crc_data_{link}": Reading(field_id) for link, field_id in enumerate(CRC_DATA_BY_LINK)},
    # NVLink 5 (Blackwell), per link: errors left after forward error correction, the bit error
    # rates after and before it, and the FEC history (bin n: codewords corrected with n symbol errors).
    "nvlink_effective_errors": Reading(pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS),
    "nvlink_effective_ber": Reading(pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER, decode=decode_ber),
    "nvlink_symbol_ber": Reading(pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER, decode=decode_ber),
    **{f"nvlink_fec_{n}": Reading(pynvml.NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_0 + n) for n in range(FEC_BINS)},
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
# The aggregate counts by memory location, named as nvmlMemoryLocation_t names the locations. nvml.h
# has these fields for the pre-Turing locations; from Turing on its enum counts DRAM (the device
# memory field) and SRAM, which has no field.
ECC_LOCATIONS = {
    "device_memory": (pynvml.NVML_FI_DEV_ECC_SBE_AGG_DEV, pynvml.NVML_FI_DEV_ECC_DBE_AGG_DEV),
    "l1_cache": (pynvml.NVML_FI_DEV_ECC_SBE_AGG_L1, pynvml.NVML_FI_DEV_ECC_DBE_AGG_L1),
    "l2_cache": (pynvml.NVML_FI_DEV_ECC_SBE_AGG_L2, pynvml.NVML_FI_DEV_ECC_DBE_AGG_L2),
    "register_file": (pynvml.NVML_FI_DEV_ECC_SBE_AGG_REG, pynvml.NVML_FI_DEV_ECC_DBE_AGG_REG),
    "texture_memory": (pynvml.NVML_FI_DEV_ECC_SBE_AGG_TEX, pynvml.NVML_FI_DEV_ECC_DBE_AGG_TEX),
    "cbu": (None, pynvml.NVML_FI_DEV_ECC_DBE_AGG_CBU),  # nvml.h counts only uncorrected errors in the CBU
}
READINGS.update({
    f"ecc_{kind}_aggregate_{location}": Reading(field_id)
    for location, ids in ECC_LOCATIONS.items()
    for kind, field_id in zip(("corrected", "uncorrected"), ids) if field_id is not None
})

# How long the clocks were held down for each reason since the driver loaded: nanosecond counters
# ("Field values for Clock Throttle Reason Counters", nvml.h). Two are the old perf-policy counters
# under new names; the other three are numbered as in CUDA 13.1's nvml.h (and pynvml). NVML has no
# such counter for the other reasons of nvmlDeviceGetCurrentClocksEventReasons.
CLOCK_EVENT_TIMES = {
    "sw_power_cap": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
    "sync_boost": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST,
    "sw_thermal_slowdown": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    "hw_thermal_slowdown": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    "hw_power_brake_slowdown": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
}
READINGS.update({f"clocks_event_ns_{reason}": Reading(field_id) for reason, field_id in CLOCK_EVENT_TIMES.items()})
# The three slowdown counters first appeared in CUDA 12.9's nvml.h (driver branch 575) as 251-253;
# CUDA 13.1's (branch 590) renumbered them 269-271 and gave 251-253 back to the power-smoothing
# fields CUDA 12.8's had there. A driver answers its own header's numbering: a 575 or 580 driver
# is asked the old IDs, an older one none (its 251-253 are power smoothing).
SLOWDOWN_TIMES_SINCE_DRIVER = 575
SLOWDOWN_TIMES_RENUMBERED_IN_DRIVER = 590
SLOWDOWN_TIMES_BEFORE_590 = {
    "clocks_event_ns_sw_thermal_slowdown": 251,
    "clocks_event_ns_hw_thermal_slowdown": 252,
    "clocks_event_ns_hw_power_brake_slowdown": 253,
}


def driver_field_ids(driver_version: Optional[str]) -> Tuple[Dict[str, int], FrozenSet[str]]:
    """The field ID of each reading for this driver version (None: unknown, taken as current), and
    the readings the driver has no field for."""
    ids = {name: reading.field_id for name, reading in READINGS.items()}
    major = _major(driver_version)
    if major is None or major >= SLOWDOWN_TIMES_RENUMBERED_IN_DRIVER:
        return ids, frozenset()
    if major >= SLOWDOWN_TIMES_SINCE_DRIVER:
        return dict(ids, **SLOWDOWN_TIMES_BEFORE_590), frozenset()
    return ids, frozenset(SLOWDOWN_TIMES_BEFORE_590)


def _major(driver_version: Optional[str]) -> Optional[int]:
    try:
        return int(str(driver_version).split(".")[0])
    except ValueError:
        return None


# The links nvml.h numbers a CRC counter field for.
CRC_LINKS = len(CRC_FLIT_BY_LINK)


def field(name: str, scope: int = 0) -> FieldKey:
    """The key a collector asks for a reading by (scope 0 for a device value, else the link); a name
    no reading (nor fallback) gives fails where the collector declares it."""
    if name not in READINGS and name not in SAMPLED_PCIE:
        raise ValueError(f"{name!r} is no reading of nvml.readings")
    return name, scope


LINK_COUNT: FrozenSet[FieldKey] = frozenset([("nvlink_link_count", 0)])
C2C_LINK_COUNT: FrozenSet[FieldKey] = frozenset([("c2c_link_count", 0)])


def c2c_link_count(device: NvmlDevice) -> int:
    """How many C2C links the device has (0 but on Grace): one batched call, made once a session
    by the collector that asks for their per-link values."""
    # The count's field ID is the same in every driver's nvml.h.
    batch = FieldBatch(device, lambda key: READINGS[key[0]].field_id, _wide)
    count = batch.read(C2C_LINK_COUNT).get(("c2c_link_count", 0), 0)
    device.forget(batch.request.query)  # not asked again this session
    return int(count)


class Readings:
    """One device's named values over an NVML session: the `wanted` keys, read by its field batch
    first, then by the fallbacks of keys the batch refused; and its NVLink link count.

    A reader serving several keys (one scope) is called once; a key it cannot answer is left out.
    """

    def __init__(self, device: NvmlDevice, driver_version: Optional[str] = None) -> None:
        self.device = device
        ids, unknown = driver_field_ids(driver_version)
        self.batch = FieldBatch(device, lambda key: ids[key[0]], _wide)
        # What the driver has no field for is known before asking: never asked, no fallback.
        self.batch.refused.update((name, 0) for name in unknown)
        self.wanted: FrozenSet[FieldKey] = frozenset()
        self._decoded: Tuple[Optional[FrozenSet[FieldKey]], tuple] = (None, ())

    @cached_property
    def links(self) -> int:
        """How many NVLink links the device has, read once a session."""
        return int(self._read(LINK_COUNT, links=0).get(("nvlink_link_count", 0), 0))

    def read(self) -> Values:
        """This run's values of the wanted keys the device gives."""
        links = self.links
        values = self._read(self.wanted, links)
        for key, decode in self._decoders():
            if key in values:
                values[key] = decode(values[key])
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

    def _decoders(self) -> Tuple[Tuple[FieldKey, Callable[[float], float]], ...]:
        """The wanted keys whose answers need decoding, worked out again only when `wanted` changes."""
        if self._decoded[0] is not self.wanted:
            found = tuple((key, READINGS[key[0]].decode) for key in self.wanted if READINGS[key[0]].decode)
            self._decoded = (self.wanted, found)
        return self._decoded[1]

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


def _wide(key: FieldKey) -> bool:
    return READINGS[key[0]].wide
