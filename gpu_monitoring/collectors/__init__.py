"""Collectors, one per capability: each reads its metrics of a GPU or MIG instance through the nvml
layer's face (`gpu_monitoring/nvml/__init__.py` names its modules). The node reader (`node_reader`) runs them.

The collectors need pynvml (through the nvml layer); this package itself does not, so the configuration can name them
in an Agent without pynvml.
"""

COLLECTOR_NAMES = ("utilization", "gpm", "memory", "thermal", "clocks", "pcie", "nvlink", "fabric", "c2c",
                   "recovery", "memory_errors", "inventory", "processes", "mig")
