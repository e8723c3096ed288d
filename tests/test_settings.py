"""What the check derives from its validated instance: folded options, a simulated node's stand-ins,
and the kubelet's arguments, from the instance's options, else from the Agent's kubelet settings,
else from the service account's defaults."""

import pytest
from datadog_checks.base import ConfigurationError

from gpu_monitoring.config.derived import DEFAULT_CA_PATH, DEFAULT_TOKEN_PATH, derive, kubelet_arguments
from gpu_monitoring.metrics.profile import Profile

from .config_support import derived, validated


def test_kubelet_arguments_default_to_the_service_account(datadog_agent, monkeypatch):
    monkeypatch.delenv("DD_KUBERNETES_KUBELET_HOST", raising=False)
    assert kubelet_arguments(validated({})) == {
        "url": "https://localhost:10250/pods",
        "token_path": DEFAULT_TOKEN_PATH,
        "ca_path": DEFAULT_CA_PATH,
        "tls_verify": True,
        "ttl": 30.0,
        "timeout": 5.0,
    }
    monkeypatch.setenv("DD_KUBERNETES_KUBELET_HOST", "10.0.0.7")
    assert kubelet_arguments(validated({}))["url"] == "https://10.0.0.7:10250/pods"


def test_kubelet_arguments_follow_the_agent_then_the_instance(datadog_agent):
    datadog_agent._config.update(
        {
            "kubernetes_kubelet_host": "fd00::7",
            "kubernetes_https_kubelet_port": 10443,
            "kubelet_auth_token_path": "/agent/token",
            "kubelet_client_ca": "/agent/ca.crt",
            "kubelet_tls_verify": "false",
        }
    )
    assert kubelet_arguments(validated({})) == {
        "url": "https://[fd00::7]:10443/pods",
        "token_path": "/agent/token",
        "ca_path": "/agent/ca.crt",
        "tls_verify": False,
        "ttl": 30.0,
        "timeout": 5.0,
    }
    instance = {
        "kubelet_url": "https://node-a:10250",
        "kubelet_token_path": "/mine/token",
        "kubelet_ca_path": "/mine/ca.crt",
        "kubelet_tls_verify": True,
        "pod_cache_ttl": 5,
        "kubelet_timeout": 2,
    }
    assert kubelet_arguments(validated(instance)) == {
        "url": "https://node-a:10250/pods",
        "token_path": "/mine/token",
        "ca_path": "/mine/ca.crt",
        "tls_verify": True,
        "ttl": 5.0,
        "timeout": 2.0,
    }


@pytest.mark.parametrize(
    "option, value",
    [
        ("kubelet_url", "node-a:10250"),
        ("kubelet_token_path", ""),
        ("kubelet_tls_verify", "yes"),
        ("pod_cache_ttl", -1),
    ],
)
def test_bad_kubelet_options_name_the_option(datadog_agent, option, value):
    with pytest.raises(ConfigurationError, match=option):
        validated({option: value})


def test_collect_processes_false_disables_the_processes_collector():
    def disabled(collectors):
        return derived({"collect_processes": False, "disabled_collectors": collectors}).disabled_collectors

    assert disabled(["gpm"]) == ["gpm", "processes"]
    assert disabled(["processes"]) == ["processes"]
    assert derived({"disabled_collectors": ["gpm"]}).disabled_collectors == ["gpm"]


@pytest.mark.parametrize("mode, derived_mode", [("auto", "auto"), (True, "true"), ("false", "false"), (False, "false")])
def test_kubernetes_is_one_of_three_words(mode, derived_mode):
    assert derived({"kubernetes": mode}).kubernetes == derived_mode


def test_the_metrics_profile_is_derived_once():
    assert derived({}).profile == Profile("standard")
    full = derived({"metrics_profile": "full"}).profile
    assert full == Profile("full") and full.sent > Profile("essential").sent


def test_stand_ins_fill_only_the_options_the_instance_leaves_unset(datadog_agent):
    config = validated({"proc_root": "/node/proc", "kubernetes": False})
    standing_in = {
        "proc_root": "/simulated/proc",
        "kubernetes": "true",
        "kubelet_url": "https://127.0.0.1:10250",
        "hourly_price": {"Tesla T4": 0.35},
        "kernel_log": "/simulated/kmsg",
    }
    result = derive(config, standing_in)
    assert result.proc_root == "/node/proc" and result.kubernetes == "false"
    assert result.kernel_log == "/simulated/kmsg"
    assert derive(validated({"kernel_log": "none"}), standing_in).kernel_log == "none"
    assert result.kubelet["url"] == "https://127.0.0.1:10250/pods"
    assert result.hourly_price == {"Tesla T4": 0.35}
    assert derive(config, {}) == derive(config)
    # The model itself is what the instance gave: the stand-ins live in what is derived.
    assert config.hourly_price == {} and config.kubelet_url is None
