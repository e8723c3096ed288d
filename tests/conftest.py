"""Shared fixtures: the Agent's stub aggregator and simulated nodes with a frozen scenario clock.

Every test reads a simulated node: the real pynvml bindings talk to the simulator's C
function pointers. Scenario time does not move by itself (speed 0); a node advances by one
collection interval (15 s) between check runs, so every value is a function of the run.
"""

import pytest
from datadog_checks.base.stubs import aggregator as _aggregator
from datadog_checks.base.stubs import datadog_agent as _datadog_agent

from gpu_monitoring.check import GpuMonitoringCheck

# The driver and device model that scenarios written by tests share; devices and faults follow.
H100_PCIE_NODE = '''driver: {version: "550.90.07", nvml_version: "12.550.90.07", cuda_version: 12040}
models:
  h100:
    name: NVIDIA H100 PCIe
    architecture: hopper
    memory_mib: 81559
    reserved_mib: 0
    bar1_mib: 131072
    clocks_max: {sm: 1755, memory: 1593, graphics: 1755, video: 1620}
    power_limit_w: 350
    idle_power_w: 48
    slowdown_c: 88
    shutdown_c: 92
    pcie: {generation: 5, width: 16}
    nvlink_links: 0
    gpm: true
    ecc: true
    row_remapping: true
    page_retirement: true
    energy: true
    mig_capable: true
'''

INTERVAL = 15
NAMESPACE = "gpu_monitoring."
HEALTH = "gpu_monitoring.device.health"
# Tags of a series of part of a GPU: a MIG instance, an NVLink link.
PARTS = {"gpu_instance_id", "nvlink_port", "c2c_link"}


def tag_dict(tags):
    return dict(tag.split(":", 1) for tag in tags)


class SimulatedNode:
    """One check instance on a simulated node; the aggregator holds the last run only. It sends
    every series (metrics_profile full) unless the test names a profile: what each profile sends
    is tests/test_metrics_profile.py's to check."""

    def __init__(self, simulate, **options):
        options = dict({"metrics_profile": "full"}, **options)
        self.check = GpuMonitoringCheck("gpu_monitoring", {}, [dict(options, simulate=str(simulate))])
        self.sim = self.check.simulated_node.nvml
        # Frozen before the node starts: writing its proc root and sysfs takes wall time, which must
        # not move scenario time.
        self.sim.clock.set_speed(0)
        # Started now rather than by the first run, so that a test can change what the simulated
        # kubelet and pod-resources answer before that run.
        self.check.start()
        self.runs = 0

    @property
    def now(self):
        return self.sim.now()

    def run(self, times=1):
        """Run the check `times` times, moving scenario time one interval before every run but the first."""
        for _ in range(times):
            if self.runs:
                self.sim.advance(INTERVAL)
            _aggregator.reset()
            error = self.check.run()
            assert error == "", f"check run at t={self.now:.0f} failed: {error}"
            self.runs += 1
        return self

    def run_until(self, seconds):
        """Run every interval from where the node is up to and including the run at scenario time `seconds`."""
        return self.run(int(seconds // INTERVAL) + 1 - self.runs)

    # --- what the last run submitted ---------------------------------------------------

    @staticmethod
    def series(metric):
        return _aggregator.metrics(NAMESPACE + metric)

    def keyed(self, metric, key, unique=True):
        """{key(tags): value} of a metric's series; a series whose key is None is left out."""
        out = {}
        for stub in self.series(metric):
            found = key(tag_dict(stub.tags))
            if found is None:
                continue
            assert not unique or found not in out, f"{metric} submitted twice for {found}"
            out[found] = stub.value
        return out

    def values(self, metric):
        """{gpu index: value} of a physical GPU's own series (MIG instances', NVLink and C2C links' left out)."""
        return self.keyed(metric, lambda t: None if PARTS & set(t) else int(t["gpu_index"]))

    def link_values(self, metric):
        """{(gpu index, NVLink port): value} of per-link series."""
        return self.keyed(metric, lambda t: (int(t["gpu_index"]), int(t["nvlink_port"])) if "nvlink_port" in t
                          else None)

    def instance_values(self, metric):
        """{(gpu index, gpu instance id): value} of MIG instance series."""
        return self.keyed(
            metric,
            lambda t: (int(t["gpu_index"]), int(t["gpu_instance_id"])) if "gpu_instance_id" in t else None,
            unique=False,
        )

    @staticmethod
    def health():
        """{gpu index: service check stub} of device.health in the last run."""
        out = {}
        for stub in _aggregator.service_checks(HEALTH):
            index = int(tag_dict(stub.tags)["gpu_index"])
            assert index not in out, f"two health checks for GPU {index}"
            out[index] = stub
        return out

    @staticmethod
    def statuses():
        return {index: stub.status for index, stub in SimulatedNode.health().items()}


@pytest.fixture(autouse=True)
def fresh_persistent_cache():
    """Each test's checks start with the Agent's persistent cache empty, as a new instance's would:
    what one test's check kept there (held verdicts, NVLink links seen up) is not another's."""
    _datadog_agent._cache.clear()
    yield


def pytest_terminal_summary(terminalreporter):
    """A fresh clone has no official Datadog chart beside it: say so in one line, not a row of `s`."""
    reasons = [report.longrepr[2] for report in terminalreporter.stats.get("skipped", [])
               if isinstance(report.longrepr, tuple)]
    if not any("official Datadog chart" in reason for reason in reasons):
        return  # and the chart's support, which loads Helm's engine, is not imported
    from .official_chart_support import skipped_for_want_of_the_chart

    line = skipped_for_want_of_the_chart(reasons)
    if line:
        terminalreporter.write_line(line, yellow=True, bold=True)


@pytest.fixture(autouse=True)
def unwrapped_cli_text(monkeypatch):
    """The CLI fits its text lines to the terminal, COLUMNS first: what a test reads of them is one line
    each, whatever terminal the suite runs in. A test of the fitting sets its own width."""
    monkeypatch.setenv("COLUMNS", "10000")


@pytest.fixture
def aggregator():
    _aggregator.reset()
    yield _aggregator
    _aggregator.reset()


@pytest.fixture
def datadog_agent():
    _datadog_agent.reset()
    yield _datadog_agent
    _datadog_agent.reset()


@pytest.fixture
def node(aggregator):
    """node(scenario name or YAML path, **instance options) -> SimulatedNode; NVML is shut down afterwards."""
    made = []

    def make(simulate, **options):
        made.append(SimulatedNode(simulate, **options))
        return made[-1]

    yield make
    for simulated in made:
        simulated.check.cancel()

