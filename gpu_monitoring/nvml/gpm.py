"""GPU Performance Monitoring: profiling metrics from two samples taken one run apart."""

import ctypes
import logging
from enum import IntEnum
from typing import Any, Dict, Optional, Tuple

import pynvml

from gpu_monitoring.nvml import library
from gpu_monitoring.nvml.device import NvmlDevice
from gpu_monitoring.nvml.errors import CannotAnswer, NvmlError
from gpu_monitoring.nvml.library import Query, answered, plain

log = logging.getLogger(__name__)


class GpmMetric(IntEnum):
    """The GPM metrics read, as nvml.h numbers them (NVML_GPM_METRIC_*)."""

    GRAPHICS_UTIL = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    SM_UTIL = pynvml.NVML_GPM_METRIC_SM_UTIL
    SM_OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
    ANY_TENSOR_UTIL = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    DRAM_BW_UTIL = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
    FP64_UTIL = pynvml.NVML_GPM_METRIC_FP64_UTIL
    FP32_UTIL = pynvml.NVML_GPM_METRIC_FP32_UTIL
    FP16_UTIL = pynvml.NVML_GPM_METRIC_FP16_UTIL
    PCIE_TX_PER_SEC = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
    PCIE_RX_PER_SEC = pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC


# A whole GPU's PCIe traffic, MiB/s averaged over the interval, as bytes per second: exact where
# the PCIe byte-counter fields are 32 bits wide and wrap many times an interval under load, and
# sampled over 20 ms by nvmlDeviceGetPcieThroughput. GPU instances have no PCIe link of their own.
MIB = 1 << 20
PCIE_METRICS = (GpmMetric.PCIE_TX_PER_SEC, GpmMetric.PCIE_RX_PER_SEC)
ACTIVITY_METRICS = tuple(metric for metric in GpmMetric if metric not in PCIE_METRICS)
SCALE = dict.fromkeys(PCIE_METRICS, MIB)
# pynvml's layouts without its per-attribute hooks, which each run's read of the answers would pay.
_Metric = plain(pynvml.c_nvmlGpmMetric_t)
MetricsGet = type("nvmlGpmMetricsGet_t", (ctypes.Structure,), {"_fields_": [
    (name, _Metric * kind._length_ if name == "metrics" else kind)
    for name, kind in pynvml.c_nvmlGpmMetricsGet_t._fields_
]})
assert ctypes.sizeof(MetricsGet) == ctypes.sizeof(pynvml.c_nvmlGpmMetricsGet_t), "nvmlGpmMetricsGet_t layout"


class GpmSampler:
    """Keeps the last sample of one GPU (or one of its GPU instances) between runs.

    The first read only takes a sample; every later read returns the averages since the
    previous one. Two sample buffers are allocated once and swapped, and so are the two metric
    queries over them (older, newer), built once: filling a query is most of what a read costs.
    """

    def __init__(self, device: NvmlDevice, gpu_instance_id: Optional[int] = None, pcie: bool = True):
        self.device = device
        self.gpu_instance_id = gpu_instance_id
        whole_gpu = gpu_instance_id is None
        self.metrics = ACTIVITY_METRICS + PCIE_METRICS if pcie and whole_gpu else ACTIVITY_METRICS
        self._samples = None
        self._queries: list = []
        self._takes: list = []  # the prepared nvmlGpm(Mig)SampleGet of each sample
        self._have_previous = False

    def supported(self) -> bool:
        return self.device.gpm_supported

    def read(self) -> Dict[GpmMetric, float]:
        """The averages since the previous read, by metric; empty at the first read and where the
        GPU has no GPM. Raises CannotAnswer where NVML cannot give them."""
        if not self.supported():
            return {}  # a GPU before Hopper, asked every run: nothing to tell, no exception to raise
        if self._samples is None:
            self._samples = [_alloc(), _alloc()]
            self._queries = [_query(self.metrics, *self._samples), _query(self.metrics, *reversed(self._samples))]
            self._takes = [self._take(sample) for sample in self._samples]
        if self.device.ask(self._takes[1]) is None:
            return {}  # no sample this run: the next one measures from the last sample taken
        query = self._queries[0]
        for alternating in (self._samples, self._queries, self._takes):
            alternating.reverse()
        if not self._have_previous:
            self._have_previous = True
            return {}
        return _metrics(self.metrics, query)

    def _take(self, sample: Any) -> Query:
        if self.gpu_instance_id is None:
            return Query("nvmlGpmSampleGet", [], answered, (sample,))
        return Query("nvmlGpmMigSampleGet", [], answered, (self.gpu_instance_id, sample))

    def close(self) -> None:
        for sample in self._samples or ():
            try:
                library.call("nvmlGpmSampleFree", sample)
            except NvmlError as e:
                log.debug("nvmlGpmSampleFree: %s", e)
        self._samples = None
        self._queries, self._takes = [], []
        self._have_previous = False


def _query(metrics: Tuple[GpmMetric, ...], first: Any, second: Any) -> Any:
    """The averages from sample `first` to sample `second`, the query NVML fills."""
    query = MetricsGet()
    query.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    query.numMetrics = len(metrics)
    query.sample1, query.sample2 = first, second
    for slot, metric in enumerate(metrics):
        query.metrics[slot].metricId = metric
    return query


def _metrics(metrics: Tuple[GpmMetric, ...], query: Any) -> Dict[GpmMetric, float]:
    try:
        library.call("nvmlGpmMetricsGet", query)
    except NvmlError as e:  # a lost GPU too: the device's own reads tell it
        raise CannotAnswer(str(e)) from e
    return {
        metric: answer.value * SCALE.get(metric, 1)
        for metric, answer in zip(metrics, query.metrics)
        if answer.nvmlReturn == pynvml.NVML_SUCCESS
    }


def _alloc() -> Any:
    try:
        return library.call("nvmlGpmSampleAlloc")
    except NvmlError as e:
        raise CannotAnswer(str(e)) from e
