"""Memory errors: volatile ECC counts, lifetime ECC totals (per GPU and by memory location), row
remapping (Ampere+) and page retirement (older)."""

from typing import List

from gpu_monitoring.collectors.base import Collector, Fields, from_fields
from gpu_monitoring.collectors.series import SeriesValue, gauge, monotonic_count
from gpu_monitoring.metrics.names import (
    ECC_ERRORS_CORRECTED,
    ECC_ERRORS_CORRECTED_TOTAL,
    ECC_ERRORS_UNCORRECTED,
    ECC_ERRORS_UNCORRECTED_TOTAL,
    REMAPPED_ROWS_CORRECTABLE,
    REMAPPED_ROWS_FAILED,
    REMAPPED_ROWS_PENDING,
    REMAPPED_ROWS_UNCORRECTABLE,
    RETIRED_PAGES_DOUBLE_BIT,
    RETIRED_PAGES_PENDING,
    RETIRED_PAGES_SINGLE_BIT,
)
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.readings import ECC_LOCATIONS, field

FIELDS = {
    field("ecc_corrected"): monotonic_count(ECC_ERRORS_CORRECTED),
    field("ecc_uncorrected"): monotonic_count(ECC_ERRORS_UNCORRECTED),
    field("remapped_correctable"): gauge(REMAPPED_ROWS_CORRECTABLE),
    field("remapped_uncorrectable"): gauge(REMAPPED_ROWS_UNCORRECTABLE),
    field("remapped_pending"): gauge(REMAPPED_ROWS_PENDING),
    field("remapped_failed"): gauge(REMAPPED_ROWS_FAILED),
    field("retired_single_bit"): gauge(RETIRED_PAGES_SINGLE_BIT),
    field("retired_double_bit"): gauge(RETIRED_PAGES_DOUBLE_BIT),
    field("retired_pending"): gauge(RETIRED_PAGES_PENDING),
}
# Each kind's lifetime total, as ECC_LOCATIONS pairs them (corrected, uncorrected).
KINDS = {"corrected": ECC_ERRORS_CORRECTED_TOTAL, "uncorrected": ECC_ERRORS_UNCORRECTED_TOTAL}
# Lifetime totals, kept by the GPU across reboots: gauges, as Datadog's built-in check sends them,
# since the total itself tells a worn board. The GPU's, and each memory location's the driver answers.
TOTALS = {
    **{field(f"ecc_{kind}_aggregate"): gauge(metric) for kind, metric in KINDS.items()},
    **{
        field(f"ecc_{kind}_aggregate_{location}"): gauge(metric, (f"memory_location:{location}",))
        for location, ids in ECC_LOCATIONS.items()
        for (kind, metric), field_id in zip(KINDS.items(), ids) if field_id is not None
    },
}


class MemoryErrors(Collector):
    name = "memory_errors"

    def fields(self, device: NvmlDevice, links: int):
        return [*FIELDS, *(key for key, series in TOTALS.items() if self.wants(series))]

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        return from_fields(fields, FIELDS) + from_fields(fields, TOTALS)
