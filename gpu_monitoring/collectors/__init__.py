"""Collectors, one per capability: each reads its metrics of a GPU or MIG instance. The node run
(`node_run`) runs them.

The collectors import pynvml; this package itself does not, so the configuration can name them
in an Agent without pynvml.
"""

COLLECTOR_NAMES = ("utilization", "gpm", "memory", "thermal", "clocks", "pcie", "nvlink", "fabric", "c2c",
                   "recovery", "memory_errors", "inventory", "processes", "mig")
