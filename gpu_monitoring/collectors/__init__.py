"""Collectors, one per capability, and the node collector (`node`) that runs them.

The collectors import pynvml; this package itself does not, so the configuration can name them
in an Agent without pynvml.
"""

COLLECTOR_NAMES = ("utilization", "gpm", "memory", "thermal", "clocks", "pcie", "nvlink",
                   "memory_errors", "processes", "mig")
