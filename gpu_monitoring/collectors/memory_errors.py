"""Memory errors: volatile ECC counts, row remapping (Ampere+) and page retirement (older)."""

from ..nvml.device import Device
from .base import Collector, Fields, copy_fields

FIELDS = {
    "ecc_corrected": "ecc.errors.corrected",
    "ecc_uncorrected": "ecc.errors.uncorrected",
    "remapped_correctable": "remapped_rows.correctable",
    "remapped_uncorrectable": "remapped_rows.uncorrectable",
    "remapped_pending": "remapped_rows.pending",
    "remapped_failed": "remapped_rows.failed",
    "retired_single_bit": "retired_pages.single_bit",
    "retired_double_bit": "retired_pages.double_bit",
    "retired_pending": "retired_pages.pending",
}


class MemoryErrors(Collector):
    name = "memory_errors"

    def fields(self, device: Device, links: int):
        return [(name, 0) for name in FIELDS]

    def collect(self, device: Device, fields: Fields, out) -> None:
        copy_fields(out.metrics, fields, FIELDS)
