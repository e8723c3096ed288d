"""gpu_monitoring under the name the Agent loads checks by (`datadog_checks.<name>`), with the
example configuration (`data/`) that `datadog-agent integration install` copies to conf.d.
The code itself lives in the top-level `gpu_monitoring` package."""

from gpu_monitoring import __version__
from gpu_monitoring.check import GpuMonitoringCheck

__all__ = ["__version__", "GpuMonitoringCheck"]
