"""What the node around the GPUs costs a run: reading it (the NVIDIA functions on the PCI bus, the
InfiniBand/RoCE ports, the driver's GPU record and the boot ID: sysfs and procfs files, no NVML
call) and judging it (node.health and the ports' series), on the simulated dgx-h100, whose sysfs
holds its GPUs, NVSwitches and ConnectX NICs and ten ports as a DGX H100's does."""

import os

from gpu_monitoring.node.hardware import HardwareReader
from gpu_monitoring.node.pci import DEVICES_DIRECTORY
from gpu_monitoring.snapshot import Node

from .harness import Bench, median_ms, thread_times
from .report import Report, Table

SCENARIO = "dgx-h100"
LIMIT_MS = 1.0


def table(rounds: int, report: Report) -> Table:
    with Bench(SCENARIO) as bench:
        bench.warm_up(2)
        options = bench.check.derived
        hardware = HardwareReader(options.sysfs_root, options.proc_root)
        node = Node()
        hardware.read_into(node)
        functions = len(os.listdir(os.path.join(options.sysfs_root, *DEVICES_DIRECTORY)))
        snapshot = bench.check.source.read()
        read_ms = median_ms(thread_times(lambda: hardware.read_into(Node()), rounds))
        judge_ms = median_ms(thread_times(lambda: bench.check.judge.node_judge.judge(snapshot), rounds))
    nvidia, ports = len(node.pci_functions or ()), len(node.network_ports or ())
    verdict = report.target(f"sysfs read per run ({ports} ports, {functions} PCI functions)", read_ms,
                            f"< {LIMIT_MS:g} ms", read_ms < LIMIT_MS)
    return Table(
        f"The node around the GPUs, {SCENARIO}: own CPU per run, median of {rounds} reads",
        ["stage", "ms/run", "target"],
        [[f"read: {functions} PCI functions ({nvidia} NVIDIA), {ports} ports, driver record, boot ID", read_ms,
          verdict],
         ["judge: node.health and the ports' series", judge_ms, ""]],
        ["no NVML call: every read is a small sysfs or procfs file; a port's network interface and link layer",
         "are resolved once, while the node's ports stay the same"],
    )

