"""Every option in spec.yaml, tried with wrong values of every kind: each is a ConfigurationError
that names the option, never a traceback nor a value taken as it is; right values work. The
options the spec lists only because the Agent or datadog-checks-base reads them are accepted and
left to them."""

import math
import re

import pytest
from datadog_checks.base import ConfigurationError

from gpu_monitoring.check import GpuMonitoringCheck
from tests.test_config_spec import agent_option_names, spec_options, standard_option_names

AGENT_OPTIONS = agent_option_names()
OPTIONS = {name: option for name, option in spec_options().items() if name not in AGENT_OPTIONS}
# The Agent's own options that the generated models check (they name the option without backticks).
MODEL_CHECKED = {
    "empty_default_hostname", "metric_patterns", "disable_generic_tags", "enable_legacy_tags_normalization",
}
TOO_LONG_SOCKET = "/run/" + "s" * 103 + ".sock"  # 112 bytes; AF_UNIX holds 107

NOT_A_STRING = [5, 1.5, True, ["a"], {"a": 1}]
BLANK_STRINGS = ["", "   ", "a\0b"]
NOT_A_BOOLEAN = ["maybe", 2.5, [], {"a": 1}]
NOT_A_NUMBER = ["5", True, [], {"a": 1}, math.nan, math.inf, -math.inf, -1, -0.5, 10**400]
NOT_A_LIST = ["a", 5, {"a": 1}, True]

EXTRA_WRONG = {
    "source": ["Local", "remote"],
    "metrics_profile": ["Standard", "minimal", "all", "full "],
    "simulate": ["no-such-scenario", "/nonexistent/node.yaml"],
    "collect_processes": ["true", "yes", 1, 0],
    "ignore_missing_sidecar": ["true", 1],
    "kubelet_tls_verify": ["false", 0],
    "sidecar_socket": [TOO_LONG_SOCKET],
    "pod_resources_socket": [TOO_LONG_SOCKET],
    "temperature_margin": [100.5, 1e6],
    "fabric_registration_grace": [-1, 86401],
    "effective_threshold": [100.1, 1e3],
    "max_processes_per_device": [1.5, 10**7],
    "kubelet_timeout": [0, 0.0, 61, 1e308],
    "min_collection_interval": [0],
    "default_hourly_price": [1e10],
    "disabled_collectors": [["nope"], ["gpm", "GPM"]],
    "xid_ignore": [[0], [-13], [True], ["13"], [1.5]],
    "kubernetes": ["yes", "TRUE", "", 1, 0, [], {"a": 1}],
    "expected_gpus": [0, 1.5, 1025],
    "fault_hold": [2592001],
    "expected_network_ports": ["Auto", "8", -1, 1.5, 1025, True, math.nan, []],
    "expected_network_rate": ["Auto", "400", 0, 0.5, 10001, True, math.inf, {"a": 1}],
    "metric_patterns": [{"include": 5}, {"exclude": [{"a": 1}]}, None],  # null: the Agent's base refuses it
    "dcgm_exporter_url": ["Auto", "off", "false", "10.0.0.5:9400", "ftp://host/metrics", "http://", "http://h:0/"],
    # Only auto, none or an absolute path: YAML's `off` and `no` are booleans, a relative path depends on
    # where the Agent runs.
    "kernel_log": ["Auto", "NONE", "off", "kern.log", "./kern.log", "var/log/kern.log", " /dev/kmsg",
                   "/var/log/kern.log\n", "/var/log/\tkern.log", False],
    "kubelet_url": [
        "localhost:10250", "ftp://host/pods", "https://", "//host:10250", "https://[::1", "https://host:99999",
        "https://host:0", "https://host:port", "https://ho st:10250", "https://host:10250/pods\n",
    ],
}


def wrong_values(name, option):
    """Values of the wrong kind for the option's type in the spec, then its own traps."""
    value = option["value"]
    kind = value.get("type")
    generic = {
        "string": NOT_A_STRING + BLANK_STRINGS,
        "boolean": NOT_A_BOOLEAN,
        "number": NOT_A_NUMBER,
        "integer": NOT_A_NUMBER + [math.nan],
        "array": NOT_A_LIST + _wrong_items(value.get("items", {})),
        "object": NOT_A_LIST[:2] + _wrong_entries(value),
    }.get(kind, [])
    return generic + EXTRA_WRONG.get(name, [])


def _wrong_items(items):
    if items.get("type") == "integer":
        return [[None], ["13"]]
    return [[None], [5], [""], ["  "]]


def _wrong_entries(value):
    if "additionalProperties" not in value:  # metric_patterns: its keys are its own
        return []
    return [{"NVIDIA H100*": bad} for bad in ("4", None, True, math.nan, math.inf, -1, 1e10, 10**400)] + [{"": 1.0}]


WRONG = [
    pytest.param(name, bad, id=f"{name}={bad!r}"[:80])
    for name, option in sorted(OPTIONS.items())
    for bad in wrong_values(name, option)
]

RIGHT = [
    ("source", "sidecar"),
    ("sidecar_socket", "/run/" + "s" * 97 + ".sock"),  # 107 bytes: the longest AF_UNIX takes
    ("simulate", "dgx-h100"),
    ("collect_processes", False),
    ("disabled_collectors", ["gpm", "nvlink"]),
    ("metrics_profile", "essential"),
    ("metrics_profile", "full"),
    ("xid_ignore", [13, 43]),
    ("temperature_margin", 0),
    ("temperature_margin", 2.5),
    ("temperature_margin", 100),
    ("fabric_registration_grace", 0),
    ("fabric_registration_grace", 600),
    ("max_processes_per_device", 0),
    ("max_processes_per_device", 1_000_000),
    ("proc_root", "/proc"),
    ("sysfs_root", "/host/sys"),
    # Not auto here: the check would read the kernel log of the machine the tests run on.
    ("kernel_log", "none"),
    ("kernel_log", "/dev/null"),  # an absolute path: a log that holds nothing yet
    ("expected_gpus", 8),
    ("expected_network_ports", 0),
    ("expected_network_ports", "auto"),
    ("expected_network_rate", 400),
    ("expected_network_rate", 12.5),
    ("network_ports_exclude", ["mlx5_4", "eth*"]),
    ("fault_hold", 0),
    ("kubernetes", False),
    ("kubernetes", "auto"),
    ("kubelet_url", "https://10.0.0.7:10250"),
    ("kubelet_url", "http://[::1]:10255/pods"),
    ("kubelet_url", "https://node-1.example.com/"),
    ("dcgm_exporter_url", "none"),
    ("dcgm_exporter_url", "http://10.244.3.17:9400/metrics"),
    ("kubelet_timeout", 0.5),
    ("kubelet_timeout", 60),
    ("pod_cache_ttl", 0),
    ("pod_cache_ttl", 86400),
    ("gpu_resource_names", ["example.com/gpu*"]),
    ("hourly_price", {}),
    ("hourly_price", {"NVIDIA H100*": 0, "NVIDIA T4": 0.35}),
    ("default_hourly_price", 0),
    ("default_hourly_price", 12.5),
    ("effective_threshold", 0),
    ("effective_threshold", 100),
    ("min_collection_interval", 0.5),
    ("service", "gpu"),
    ("tags", ["team:ml"]),
    ("empty_default_hostname", True),
    ("metric_patterns", {"include": ["gpu_monitoring.*"]}),
    # The Agent's own, as a real Agent configuration may hold them.
    ("name", "gpu-node-a7"),
    ("namespace", "default"),
    ("no_index", False),
    ("loader", "python"),
    ("process_isolation", False),
    ("__memory_profiling_tags", ["platform:linux"]),
]


def make(instance):
    return GpuMonitoringCheck("gpu_monitoring", {}, [instance])


@pytest.mark.parametrize("name, bad", WRONG)
def test_wrong_value_is_a_configuration_error_naming_the_option(name, bad):
    with pytest.raises(ConfigurationError) as error:
        make({name: bad})
    named = name if name in MODEL_CHECKED else f"`{name}`"
    assert named in str(error.value)


def test_a_wrong_kernel_log_says_what_the_option_takes():
    with pytest.raises(ConfigurationError) as error:
        make({"kernel_log": "kern.log"})
    assert str(error.value) == (
        "`kernel_log` must be auto, none or an absolute path such as /var/log/kern.log; got 'kern.log'")
    with pytest.raises(ConfigurationError, match=r"`kernel_log` must be auto, none or .*; got False$"):
        make({"kernel_log": False})  # `kernel_log: off` in YAML


def test_every_option_is_tried_with_wrong_values_and_a_right_one():
    tried = {name for name, option in OPTIONS.items() if len(wrong_values(name, option)) >= 4}
    assert tried == set(OPTIONS)
    assert set(OPTIONS) - {name for name, _ in RIGHT} <= standard_option_names() | {
        "nvml_library_path", "ignore_missing_sidecar", "kubelet_token_path", "kubelet_ca_path",
        "kubelet_tls_verify", "pod_resources_socket",
    }
    assert AGENT_OPTIONS <= {name for name, _ in RIGHT}


@pytest.mark.parametrize("name, good", RIGHT, ids=[f"{n}={v!r}"[:80] for n, v in RIGHT])
def test_right_value_is_accepted_and_the_check_runs(name, good):
    if name == "source":
        make({name: good})  # nothing to read without a sidecar: accepting it is the point
        return
    instance = {"simulate": "t4-shared", "kubernetes": "false", name: good}
    assert make(instance).run() == ""


@pytest.mark.parametrize("name", sorted(set(OPTIONS) - {"metric_patterns"}))
def test_an_option_left_empty_is_its_default(name):
    # `option:` with nothing after it is null in YAML: the check and its models both take the default.
    empty, default = make({name: None}), make({})
    assert empty.derived == default.derived
    assert empty.config == default.config


SCENARIO_FILES = {
    "binary": b"\xff\xfe\x00\x01binary\x00",
    "list": b"- devices\n- driver\n",
    "scalar": b"42\n",
    "string": b"dgx-h100\n",
    "empty": b"",
    "yaml error": b"devices: [\n",
    "devices not a list": b"devices: 8\ndriver: {}\n",
    "device not a mapping": b"devices: [h100]\ndriver: {}\n",
    "fault not a mapping": b"devices: []\ndriver: {}\nfaults: [xid]\n",
}


@pytest.mark.parametrize("content", SCENARIO_FILES.values(), ids=SCENARIO_FILES.keys())
def test_scenario_file_that_is_no_node_is_a_configuration_error(tmp_path, content):
    scenario = tmp_path / "node.yaml"
    scenario.write_bytes(content)
    with pytest.raises(ConfigurationError, match="`simulate`"):
        make({"simulate": str(scenario)})


def test_scenario_path_that_is_a_directory_or_huge_is_a_configuration_error(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:
        f.truncate(64 * 1024 * 1024)  # sparse: no time nor disk spent
    for path in (tmp_path / "dir.yaml", huge):
        with pytest.raises(ConfigurationError, match=re.escape("`simulate`")):
            make({"simulate": str(path)})
