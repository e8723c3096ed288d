"""The sidecar reads the node's dcgm-exporter when given --dcgm-exporter-url: the real sidecar (a
subprocess on a unix socket) reads the simulated exporter (a real HTTP server in this process), and
the check in sidecar mode takes DCGM's activity and the read's outcome from its snapshot without
reading the exporter itself; a sidecar without the URL leaves the check to read it."""

import argparse
import logging
import re

import pytest
from datadog_checks.base import AgentCheck
from datadog_checks.base.stubs import aggregator as _aggregator

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.sidecar import command
from gpu_monitoring.simulator.dcgm_exporter_server import DcgmExporterServer
from gpu_monitoring.simulator.library import SimulatedNvml
from gpu_monitoring.simulator.scenario import load as load_scenario
from gpu_monitoring.snapshot import Snapshot

from .conftest import tag_dict
from .deploy_support import DEPLOY, daemonset, options, sidecar_container
from .sidecar_support import sidecars_fixture  # noqa: F401

SCENARIO = "a100-mig"
CAN_CONNECT = "gpu_monitoring.dcgm.can_connect"


@pytest.fixture
def exporter():
    nvml = SimulatedNvml(load_scenario(SCENARIO))
    with DcgmExporterServer(nvml, nvml.scenario.dcgm_exporter) as server:
        yield server


@pytest.fixture
def check_on():
    """check_on(sidecar, **options): a check in sidecar mode, cancelled after the test; its runs leave
    only their own submissions in the aggregator."""
    made = []

    def make(sidecar, **options):
        instance = dict({"kubernetes": False, "metrics_profile": "full"}, **options, source="sidecar",
                        sidecar_socket=sidecar.socket)
        made.append(GpuMonitoringCheck("gpu_monitoring", {}, [instance]))
        return made[-1]

    yield make
    for check in made:
        check.cancel()
    _aggregator.reset()


def run(check):
    _aggregator.reset()
    assert check.run() == ""


def instance_activity():
    """{(gpu index, gpu instance id): sm_active} of the last run."""
    return {(int(t["gpu_index"]), int(t["gpu_instance_id"])): stub.value
            for stub in _aggregator.metrics("gpu_monitoring.sm_active")
            for t in [tag_dict(stub.tags)] if "gpu_instance_id" in t}


def dcgm_status():
    checks = _aggregator.service_checks(CAN_CONNECT)
    assert len(checks) <= 1
    return (checks[0].status, checks[0].message) if checks else None


def test_a_sidecar_given_the_url_serves_dcgm_activity_and_the_check_reads_no_exporter(sidecars, exporter, check_on):
    sidecar = sidecars(SCENARIO, "--dcgm-exporter-url", exporter.url)
    snapshot = sidecar.client().snapshot()
    assert snapshot.dcgm_read.status == "ok" and snapshot.dcgm_read.reason is None
    sources = {i.activity_source for d in snapshot.devices for i in d.mig_instances}
    assert sources == {"dcgm"}, "every MIG instance's activity is DCGM's (A100: no GPM)"
    assert exporter.requests == 1
    # The check is told the same exporter: the sidecar's read stands, and it reads it not again.
    check = check_on(sidecar, dcgm_exporter_url=exporter.url)
    for runs in (1, 2):
        run(check)
        assert exporter.requests == 1 + runs, "one request a run: the sidecar's"
    assert dcgm_status() == (AgentCheck.OK, "")
    assert instance_activity() and len(instance_activity()) == sum(len(d.mig_instances) for d in snapshot.devices)


def test_an_exporter_down_behind_the_sidecar_is_the_checks_critical(sidecars, check_on, caplog):
    caplog.set_level(logging.INFO)
    nvml = SimulatedNvml(load_scenario(SCENARIO))
    with DcgmExporterServer(nvml, nvml.scenario.dcgm_exporter) as gone:
        url = gone.url  # its port, closed once it has stopped
    check = check_on(sidecars(SCENARIO, "--dcgm-exporter-url", url))
    run(check)
    run(check)
    status, message = dcgm_status()
    assert status == AgentCheck.CRITICAL and message.startswith(f"cannot connect to {url}: "), message
    told = [r.getMessage() for r in caplog.records if "dcgm-exporter" in r.getMessage()]
    assert told == [f"DCGM activity is not read from dcgm-exporter: {message}"], "logged once while it lasts"
    assert instance_activity() == {}
    assert _aggregator.metrics("gpu_monitoring.temperature") and _aggregator.metrics("gpu_monitoring.memory.used"), \
        "the run's other metrics go out"


def test_a_sidecar_without_the_url_leaves_the_check_to_read(sidecars, exporter, check_on):
    sidecar = sidecars(SCENARIO)
    assert sidecar.client().snapshot().dcgm_read is None
    check = check_on(sidecar, dcgm_exporter_url=exporter.url)
    run(check)
    run(check)
    assert exporter.requests == 2, "the check's own reads"
    assert dcgm_status() == (AgentCheck.OK, "") and instance_activity()


def test_the_chart_passes_the_exporter_url_only_when_set():
    url = "http://nvidia-dcgm-exporter.gpu-operator.svc:9400/metrics"
    assert options(sidecar_container(daemonset({"sidecar": {"dcgmExporterUrl": url}}))["args"])[
        "--dcgm-exporter-url"] == url
    assert "--dcgm-exporter-url" not in sidecar_container(daemonset())["args"]


def test_the_systemd_unit_takes_the_options_a_drop_in_sets():
    unit = (DEPLOY / "systemd" / "gpu-monitoring-sidecar.service").read_text()
    (exec_start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start.endswith(" $GPU_MONITORING_SIDECAR_OPTIONS")
    readme = (DEPLOY / "systemd" / "README.md").read_text()
    options = re.findall(r"^Environment=GPU_MONITORING_SIDECAR_OPTIONS=(\S+)$", readme, re.MULTILINE)
    commands = argparse.ArgumentParser().add_subparsers()
    command.add_parsers(commands)
    urls = [commands.choices["sidecar"].parse_args([option]).dcgm_exporter_url for option in options]
    assert "http://127.0.0.1:9400/metrics" in urls


def test_an_older_sidecars_snapshot_without_the_read_still_loads(sidecars):
    written = sidecars("legacy-driver").client().get("/v1/snapshot")["snapshot"]
    assert written["dcgm_read"] is None, "a sidecar without the URL reads no exporter"
    del written["dcgm_read"]
    assert Snapshot.from_dict(written).dcgm_read is None
    with pytest.raises(ValueError, match="snapshot.dcgm_read.status 'OK' is not one this check knows"):
        Snapshot.from_dict(dict(written, dcgm_read={"status": "OK", "reason": None}))
