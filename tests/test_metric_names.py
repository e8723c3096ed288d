"""Metric names are written once: metrics.yaml, and the constants generated from it (metrics/names.py).
Code names a metric by its constant; a name no code should send fails loudly, and the one legitimate
unknown name, a newer sidecar's over JSON, is dropped with one debug log."""

import ast
import logging
import threading
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
from datadog_checks.base.stubs import aggregator

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.collectors.node_reader import NodeReader
from gpu_monitoring.metrics import names, write_names
from gpu_monitoring.metrics.names import TEMPERATURE
from gpu_monitoring.metrics.spec import NAMESPACE, SPEC
from gpu_monitoring.nvml.session import NvmlSession
from gpu_monitoring.sidecar import protocol
from gpu_monitoring.sidecar.server import UnixHttpServer
from gpu_monitoring.simulator.clock import SimClock
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import load as load_scenario
from gpu_monitoring.submission.submitter import Submitter, UnknownMetric

PACKAGE = Path(__file__).resolve().parents[1] / "gpu_monitoring"
# The one module that may spell a metric's name.
NAMES_MODULE = PACKAGE / "metrics" / "names.py"
FULL_NAMES = {f"{NAMESPACE}.{name}" for name in SPEC}
# What a metric's name may be composed from: `clock.` in f"clock.{kind}".
PREFIXES = {name[:end + 1] for name in SPEC for end, char in enumerate(name) if char == "."}


def test_names_module_is_generated_from_metrics_yaml():
    assert NAMES_MODULE.read_text() == write_names.source(), (
        "gpu_monitoring/metrics/names.py is stale: run `python -m gpu_monitoring.metrics.write_names`"
    )


def test_every_metric_has_one_constant_and_every_constant_names_a_metric():
    constants = {key: value for key, value in vars(names).items() if key.isupper()}
    assert sorted(constants.values()) == sorted(SPEC)
    assert constants["CLOCKS_EVENT_GPU_IDLE"] == "clocks_event.gpu_idle"
    assert constants["C2C_ERRORS_REPLAY_B2B"] == "c2c.errors.replay.b2b"


def test_two_metrics_that_would_share_a_constant_are_refused():
    with pytest.raises(ValueError, match="'memory.bar1' and 'memory_bar1' would both be named MEMORY_BAR1"):
        write_names.constants(["memory.bar1", "memory_bar1"])


def test_a_misspelt_name_fails_where_it_is_imported():
    with pytest.raises(ImportError, match="TEMPERATUR"):
        exec("from gpu_monitoring.metrics.names import TEMPERATUR", {})


def bare_names(tree: ast.AST) -> Iterator[Tuple[int, str]]:
    """String literals that are a metric's name (with or without the namespace) or the start of one
    (`"clock."`), and f-strings that compose one (`f"clock.{kind}"`), each once."""
    nodes = list(ast.walk(tree))
    in_fstrings = {id(part) for node in nodes if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstrings:
            if node.value in SPEC or node.value in FULL_NAMES or node.value in PREFIXES:
                yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and first.value in PREFIXES:
                yield node.lineno, ast.unparse(node)


def package_bare_names() -> List[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == NAMES_MODULE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        found += [f"{path.relative_to(PACKAGE.parent)}:{line}: {text}" for line, text in bare_names(tree)]
    return found


def test_no_metric_name_is_spelt_outside_metrics_yaml_and_its_constants():
    assert package_bare_names() == [], "name these metrics by their constants in gpu_monitoring.metrics.names"


def test_the_search_finds_names_literal_full_and_composed():
    source = ('a = "utilization.gpu"\nb = "gpu_monitoring.temperature"\nc = f"clock.{kind}"\n'
              'd = "clock." + kind\ne = "nvlink_port:3"\nf = f"node.pci: {entry}"\n')
    assert [line for line, _ in bare_names(ast.parse(source))] == [1, 2, 3, 4]


# --- names at submission -----------------------------------------------------------------------


@pytest.fixture
def check():
    made = GpuMonitoringCheck("gpu_monitoring", {}, [{"kubernetes": False}])
    aggregator.reset()
    yield made
    aggregator.reset()


def test_sending_a_name_the_spec_does_not_have_raises(check):
    submitter = Submitter(check, ["team:ml"], lambda _entity: [])
    with pytest.raises(UnknownMetric, match="'temperatur' is not in metrics.yaml"):
        submitter.send("temperatur", 41, [])
    submitter.send(TEMPERATURE, 41, [])
    aggregator.assert_metric(f"{NAMESPACE}.{TEMPERATURE}", value=41, tags=[])


def test_a_name_the_profile_leaves_out_is_not_sent_and_does_not_raise(check):
    from gpu_monitoring.metrics.names import CLOCK_VIDEO
    from gpu_monitoring.metrics.profile import Profile

    Submitter(check, [], lambda _entity: [], profile=Profile("essential")).send(CLOCK_VIDEO, 1500, [])
    assert aggregator.metric_names == []


# --- a newer sidecar's metric --------------------------------------------------------------------

NEWER = "hbm.stacks.degraded"  # a metric some later version might send


def served_snapshot(tmp_path) -> dict:
    """A snapshot of a real node read (t4-shared, no Kubernetes), as a newer sidecar serves it: its
    first GPU carries a metric this check does not know, beside the ones it does."""
    nvml = SimulatedNvml(load_scenario("t4-shared"), SimClock(speed=0))
    reader = NodeReader(NvmlSession(nvml.library), proc_root=None, watch_events=False)
    try:
        served = reader.read().to_dict()
    finally:
        reader.close()
    served["devices"][0]["metrics"][NEWER] = 1.0
    return served


@pytest.fixture
def newer_sidecar(tmp_path):
    served = served_snapshot(tmp_path)
    path = str(tmp_path / "sidecar.sock")
    routes = {
        protocol.SNAPSHOT_PATH: lambda params: (200, {"snapshot": served}),
        protocol.EVENTS_PATH: lambda params: (200, {"events": [], "last_seq": 0, "first_seq": 1, "lost": False,
                                                    "epoch": "newer"}),
        protocol.HEALTH_PATH: lambda params: (200, {"status": "ok", "events": "ok", "journal": "ok"}),
    }
    server = UnixHttpServer(path, routes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()


def test_a_newer_sidecars_metric_is_dropped_with_one_debug_log(newer_sidecar, caplog):
    check = GpuMonitoringCheck("gpu_monitoring", {}, [{"source": "sidecar", "sidecar_socket": newer_sidecar,
                                                       "kubernetes": False}])
    aggregator.reset()
    try:
        with caplog.at_level(logging.DEBUG, logger="gpu_monitoring.submission"):
            assert check.run() == ""
            assert check.run() == ""
        sent = set(aggregator.metric_names)
    finally:
        check.cancel()
        aggregator.reset()
    assert f"{NAMESPACE}.{TEMPERATURE}" in sent
    assert f"{NAMESPACE}.{NEWER}" not in sent
    told = [record for record in caplog.records if NEWER in record.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.DEBUG
