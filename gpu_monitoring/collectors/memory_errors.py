"""Memory errors: volatile ECC counts, lifetime ECC totals (per GPU and by memory location), row
remapping (Ampere+) and page retirement (older)."""

from typing import List

from gpu_monitoring.collectors.base import Collector, Fields, from_fields
from gpu_monitoring.collectors.series import SeriesValue, gauge, monotonic_count
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.readings import ECC_LOCATIONS

KINDS = ("corrected", "uncorrected")
FIELDS = {
    ("ecc_corrected", 0): monotonic_count("ecc.errors.corrected"),
    ("ecc_uncorrected", 0): monotonic_count("ecc.errors.uncorrected"),
    ("remapped_correctable", 0): gauge("remapped_rows.correctable"),
    ("remapped_uncorrectable", 0): gauge("remapped_rows.uncorrectable"),
    ("remapped_pending", 0): gauge("remapped_rows.pending"),
    ("remapped_failed", 0): gauge("remapped_rows.failed"),
    ("retired_single_bit", 0): gauge("retired_pages.single_bit"),
    ("retired_double_bit", 0): gauge("retired_pages.double_bit"),
    ("retired_pending", 0): gauge("retired_pages.pending"),
}
# Lifetime totals, kept by the GPU across reboots: gauges, as Datadog's built-in check sends them,
# since the total itself tells a worn board. The GPU's, and each memory location's the driver answers.
TOTALS = {
    **{(f"ecc_{kind}_aggregate", 0): gauge(f"ecc.errors.{kind}.total") for kind in KINDS},
    **{
        (f"ecc_{kind}_aggregate_{location}", 0): gauge(f"ecc.errors.{kind}.total", (f"memory_location:{location}",))
        for location, ids in ECC_LOCATIONS.items()
        for kind, field_id in zip(KINDS, ids) if field_id is not None
    },
}


class MemoryErrors(Collector):
    name = "memory_errors"

    def fields(self, device: NvmlDevice, links: int):
        return [*FIELDS, *(key for key, series in TOTALS.items() if self.wants(series))]

    def collect(self, device: NvmlDevice, fields: Fields) -> List[SeriesValue]:
        return from_fields(fields, FIELDS) + from_fields(fields, TOTALS)
