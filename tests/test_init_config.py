"""init_config is checked as an instance is: an option of an instance given there, an unknown one or a
bad value is a ConfigurationError naming it; what the Agent and datadog-checks-base read there passes."""

import pytest
from datadog_checks.base import ConfigurationError

from gpu_monitoring.check import GpuMonitoringCheck
from gpu_monitoring.cli import main as cli

from .config_support import validated_shared


def make(init_config):
    return GpuMonitoringCheck("gpu_monitoring", init_config, [{}])


def test_an_instance_option_in_init_config_is_refused_saying_where_it_goes():
    with pytest.raises(ConfigurationError) as error:
        make({"metrics_profile": "full"})
    assert str(error.value) == "`metrics_profile` is an instance option: set it in each instance, not in init_config"
    with pytest.raises(ConfigurationError, match="`tags` is an instance option"):
        make({"service": "training", "tags": ["team:ml"]})
    with pytest.raises(ConfigurationError, match="`kernel_log` is an instance option"):
        make({"kernel_log": "none"})


def test_an_unknown_init_config_option_is_refused_naming_the_closest_one():
    with pytest.raises(ConfigurationError) as error:
        make({"servce": "training"})
    assert str(error.value) == "unknown init_config option `servce`; did you mean `service`?"
    with pytest.raises(ConfigurationError) as error:
        make({"colour": "red"})
    assert str(error.value) == "unknown init_config option `colour`; conf.yaml.example lists the options"


@pytest.mark.parametrize("init_config, option", [({"service": ""}, "service"), ({"service": 3}, "service"),
                                                 ({"loader": ["python"]}, "loader")])
def test_a_bad_init_config_value_names_the_option(init_config, option):
    with pytest.raises(ConfigurationError, match=f"`{option}`"):
        make(init_config)


def test_what_the_agent_and_its_tooling_read_from_init_config_is_accepted():
    check = make({"service": "training", "loader": "python", "process_isolation": False,
                  "profile_memory": "/tmp/profiles", "profile_memory_frames": 50, "set_breakpoint": 12})
    assert (check.shared_config.service, check.shared_config.loader) == ("training", "python")
    assert validated_shared({"service": None}).service is None  # `service:` left empty
    assert validated_shared({}).process_isolation is False


def test_the_cli_refuses_an_instance_option_in_init_config(tmp_path, capsys):
    config = tmp_path / "conf.yaml"
    config.write_text("init_config:\n  metrics_profile: full\ninstances:\n  - simulate: t4-shared\n")
    assert cli.main(["check", "--config", str(config)]) == 2
    out = capsys.readouterr()
    assert out.err == ("gpu-monitoring check: `metrics_profile` is an instance option: set it in each instance, "
                       "not in init_config\n")
    assert out.out == ""
