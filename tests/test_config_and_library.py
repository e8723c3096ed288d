"""Instance options (errors that name the option, and their effect) and a missing NVML library."""

import ctypes.util
import logging

import pytest
from datadog_checks.base import AgentCheck, ConfigurationError

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.cli import main as cli
from gpu_monitoring.metrics.spec import SPEC

MISSING_LIBRARY = "/nonexistent/libnvidia-ml.so.1"


def make(instance):
    return GpuMonitoringCheck("gpu_monitoring", {}, [instance])


@pytest.mark.parametrize(
    "instance, option",
    [
        ({"xid_ignore": "x"}, "xid_ignore"),
        ({"xid_ignore": 13}, "xid_ignore"),
        ({"xid_ignore": [0]}, "xid_ignore"),
        ({"xid_ignore": [True]}, "xid_ignore"),
        ({"xid_ignore": ["13"]}, "xid_ignore"),
        ({"disabled_collectors": ["nope"]}, "disabled_collectors"),
        ({"disabled_collectors": "gpm"}, "disabled_collectors"),
        ({"temperature_margin": -1}, "temperature_margin"),
        ({"temperature_margin": "5"}, "temperature_margin"),
        ({"temperature_margin": True}, "temperature_margin"),
        ({"simulate": "no-such-scenario"}, "simulate"),
        ({"simulate": ""}, "simulate"),
        ({"simulate": 3}, "simulate"),
        ({"nvml_library_path": 5}, "nvml_library_path"),
        ({"nvml_library_path": "  "}, "nvml_library_path"),
        ({"collect_processes": "yes"}, "collect_processes"),
        ({"tags": "team:ml"}, "tags"),
        ({"tags": [1]}, "tags"),
        ({"source": "remote"}, "source"),
    ],
)
def test_bad_option_is_a_configuration_error_naming_it(instance, option):
    with pytest.raises(ConfigurationError, match=f"`{option}`"):
        make(instance)


def test_error_messages_say_what_is_allowed():
    with pytest.raises(ConfigurationError) as error:
        make({"disabled_collectors": ["gpm", "nope"]})
    assert "'nope'" in str(error.value)
    assert "utilization" in str(error.value) and "memory_errors" in str(error.value)
    with pytest.raises(ConfigurationError) as error:
        make({"simulate": "no-such-scenario"})
    assert "dgx-h100" in str(error.value) and "faults" in str(error.value)
    with pytest.raises(ConfigurationError) as error:
        make({"metrics_profile": "minimal"})
    assert str(error.value) == "`metrics_profile` must be one of essential, standard, full; got 'minimal'"


def test_a_misspelt_option_is_refused_naming_the_closest_one():
    with pytest.raises(ConfigurationError) as error:
        make({"simulate": "dgx-h100", "hourly_prices": {"NVIDIA H100*": 4.0}})
    assert str(error.value) == "unknown option `hourly_prices`; did you mean `hourly_price`?"
    with pytest.raises(ConfigurationError, match="did you mean `metrics_profile`"):
        make({"metric_profile": "essential"})


def test_an_option_like_none_other_is_refused_too():
    with pytest.raises(ConfigurationError) as error:
        make({"colour": "red"})
    assert str(error.value) == "unknown option `colour`; conf.yaml.example lists the options"


# What a real Agent configuration may hold besides the check's own options: the Agent's generic
# ones, those it and datadog-checks-base read from every instance, and ddev's.
AGENT_INSTANCE = {
    "tags": ["team:ml"],
    "service": "training",
    "min_collection_interval": 30,
    "empty_default_hostname": False,
    "metric_patterns": {"exclude": ["gpu_monitoring\\.clock\\..*"]},
    "disable_generic_tags": False,
    "enable_legacy_tags_normalization": True,
    "name": "gpu-node-a7",
    "namespace": "default",
    "no_index": False,
    "loader": "python",
    "process_isolation": False,
    "__memory_profiling_tags": ["platform:linux"],
}


def test_the_agents_own_options_are_accepted(aggregator, caplog):
    caplog.set_level(logging.WARNING)
    check = make(dict(AGENT_INSTANCE, simulate="t4-shared", kubernetes="false"))
    try:
        assert check.run() == ""
    finally:
        check.cancel()
    assert aggregator.metrics("gpu_monitoring.temperature")
    assert aggregator.metrics("gpu_monitoring.clock.sm") == []  # metric_patterns took them out
    assert not [r.getMessage() for r in caplog.records if "typo" in r.getMessage()]


def test_the_cli_refuses_a_misspelt_option_with_exit_status_2(tmp_path, capsys):
    config = tmp_path / "conf.yaml"
    config.write_text("instances:\n  - simulate: dgx-h100\n    hourly_prices:\n      NVIDIA H100*: 4.0\n")
    assert cli.main(["check", "--config", str(config)]) == 2
    out = capsys.readouterr()
    assert out.err == "gpu-monitoring check: unknown option `hourly_prices`; did you mean `hourly_price`?\n"
    assert out.out == ""


@pytest.mark.parametrize("instance", [{"xid_ignore": 0}, {"disabled_collectors": False}, {"tags": ""}])
def test_falsy_value_of_the_wrong_type_is_an_error_too(instance):
    # `xid_ignore: 13` is rejected as "must be a list"; `xid_ignore: 0` must be as well.
    (option,) = instance
    with pytest.raises(ConfigurationError, match=f"`{option}`"):
        make(instance)


def test_broken_scenario_file(tmp_path):
    scenario = tmp_path / "broken.yaml"
    scenario.write_text("description: no devices here\n")
    with pytest.raises(ConfigurationError, match="`simulate`"):
        make({"simulate": str(scenario)})


def test_good_options_are_accepted(tmp_path):
    check = make({
        "simulate": "t4-shared",
        "xid_ignore": [13, 43],
        "disabled_collectors": ["gpm", "nvlink"],
        "temperature_margin": 0,
        "collect_processes": True,
        "tags": ["team:ml"],
    })
    assert check.config.xid_ignore == (13, 43)
    assert check.config.temperature_margin == 0
    assert check.config.tags == ("team:ml",)
    assert check.derived.disabled_collectors == ["gpm", "nvlink"]


def test_disabled_collectors(node):
    dgx = node("dgx-h100", disabled_collectors=["gpm", "nvlink"]).run(2)
    assert dgx.series("sm_active") == []
    assert dgx.series("nvlink.links.active") == []
    assert dgx.series("nvlink.throughput.tx") == []
    assert dgx.sim.calls["nvmlGpmSampleGet"] == 0
    # Everything else is still read.
    assert len(dgx.values("temperature")) == 8
    assert len(dgx.values("utilization.gpu")) == 8
    assert dgx.values("pcie.link.generation") == dict.fromkeys(range(8), 5)


def test_collect_processes_false(node):
    dgx = node("dgx-h100", collect_processes=False).run(2)
    assert dgx.series("processes.count") == []
    assert dgx.sim.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 0
    assert len(dgx.values("memory.used")) == 8


def test_missing_library(aggregator, caplog):
    caplog.set_level(logging.DEBUG)
    check = make({"nvml_library_path": MISSING_LIBRARY})
    for _ in range(3):
        assert check.run() == ""
    connects = aggregator.service_checks("gpu_monitoring.nvml.can_connect")
    assert len(connects) == 3
    for stub in connects:
        assert stub.status == AgentCheck.CRITICAL
        assert stub.message.startswith(f"could not load nvml_library_path {MISSING_LIBRARY}: ")
    # No GPU reading; only the node's own, read from sysfs this run without NVML.
    assert all(SPEC[name[len("gpu_monitoring."):]].scope in ("node", "port") for name in aggregator.metric_names)
    assert aggregator.service_checks("gpu_monitoring.device.health") == []
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert MISSING_LIBRARY in warnings[0].getMessage()
    check.cancel()


def test_missing_library_with_instance_tags(aggregator):
    check = make({"nvml_library_path": MISSING_LIBRARY, "tags": ["team:ml"]})
    assert check.run() == ""
    aggregator.assert_service_check(
        "gpu_monitoring.nvml.can_connect", status=AgentCheck.CRITICAL, tags=["team:ml"], count=1
    )


@pytest.mark.skipif(ctypes.util.find_library("c") is None, reason="no C library to load")
def test_library_that_is_not_nvml(aggregator, caplog):
    caplog.set_level(logging.WARNING)
    libc = ctypes.util.find_library("c")
    check = make({"nvml_library_path": libc})
    assert check.run() == ""
    assert check.run() == ""
    connects = aggregator.service_checks("gpu_monitoring.nvml.can_connect")
    assert [s.status for s in connects] == [AgentCheck.CRITICAL] * 2
    assert "NVML did not initialise" in connects[0].message
    assert libc in connects[0].message
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
