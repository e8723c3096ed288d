"""Memory errors: volatile ECC counts, row remapping (Ampere+) and page retirement (older)."""

from typing import List

from ..nvml.device import Device
from .base import Collector, Fields, from_fields
from .series import Reading, gauge, monotonic_count

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


class MemoryErrors(Collector):
    name = "memory_errors"

    def fields(self, device: Device, links: int):
        return list(FIELDS)

    def collect(self, device: Device, fields: Fields) -> List[Reading]:
        return from_fields(fields, FIELDS)
