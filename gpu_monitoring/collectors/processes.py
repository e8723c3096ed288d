"""Compute and MPS-client processes on a GPU or MIG instance."""

from ..nvml import CannotAnswer, Device
from ..snapshot import Process
from .base import Collector, Fields


class Processes(Collector):
    name = "processes"

    def collect(self, device: Device, fields: Fields, out) -> None:
        try:
            found = device.processes()
        except CannotAnswer:
            return
        out.processes = [Process(**p) for p in found]
        out.metrics["processes.count"] = len({p.pid for p in out.processes})
