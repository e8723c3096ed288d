"""PCIe throughput, replays and link training."""

from ..nvml import CannotAnswer, Device
from .base import Collector, Fields, copy_fields, read


class Pcie(Collector):
    name = "pcie"

    def fields(self, device: Device):
        return [("pcie_replay", 0)]

    def collect(self, device: Device, fields: Fields, out) -> None:
        m = out.metrics
        try:
            tx, rx = device.pcie_throughput_kib()
            m["pcie.throughput.tx"], m["pcie.throughput.rx"] = tx * 1024, rx * 1024
        except CannotAnswer:
            pass
        try:
            m["pcie.link.generation"], m["pcie.link.width"] = device.pcie_link()
        except CannotAnswer:
            pass
        generation, width = device.pcie_link_max
        read(m, "pcie.link.generation.max", lambda: generation)
        read(m, "pcie.link.width.max", lambda: width)
        copy_fields(m, fields, {"pcie_replay": "pcie.replay_errors"})
