"""What the check derives from its validated instance, once: the values that depend on the host, on the
Agent or on a simulated node, and options folded into one another. Every other option is read from the
instance's model itself (`GpuMonitoringCheck.config`)."""

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Union
from urllib.parse import urlsplit

from datadog_checks.base import is_affirmative

from gpu_monitoring.config.proc_root import default_proc_root
from gpu_monitoring.config_models import InstanceConfig
from gpu_monitoring.metrics.profile import Profile

try:
    import datadog_agent
except ImportError:
    from datadog_checks.base.stubs import datadog_agent

# Where a pod's service account finds its token and the cluster's CA (Kubernetes: "Accessing the
# Kubernetes API from a Pod"), and the kubelet's own HTTPS port.
DEFAULT_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
DEFAULT_CA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
DEFAULT_HOST = "localhost"
DEFAULT_PORT = 10250


@dataclass(frozen=True)
class Derived:
    """The options a simulated node stands in for are read here, not from the model: with `simulate`,
    its values fill those the instance leaves unset."""

    kubernetes: str  # auto | true | false; YAML's booleans as these words
    kubelet: Dict[str, Any]  # KubeletClient's arguments
    pod_resources_socket: str
    proc_root: str
    sysfs_root: str
    kernel_log: str  # auto | none | a path; a simulated node's file of kmsg records where the instance leaves it unset
    expected_gpus: Optional[int]
    hourly_price: Mapping[str, float]
    disabled_collectors: List[str]  # with `processes` when collect_processes is false
    profile: Profile  # what metrics_profile sends, and so what collection need not read


def derive(config: InstanceConfig, standing_in: Optional[Mapping[str, Any]] = None) -> Derived:
    """What a validated instance gives the check. `standing_in` holds a simulated node's values (its proc
    root, sysfs, kernel log, prices, kubelet and pod-resources socket) for the options the instance does not set."""
    if standing_in:
        config = config.model_copy(update={k: v for k, v in standing_in.items() if k not in config.model_fields_set})
    return Derived(
        kubernetes=_mode(config.kubernetes),
        kubelet=kubelet_arguments(config),
        pod_resources_socket=config.pod_resources_socket,
        proc_root=config.proc_root or default_proc_root(),
        sysfs_root=config.sysfs_root,
        kernel_log=config.kernel_log,
        expected_gpus=config.expected_gpus,
        hourly_price=config.hourly_price,
        disabled_collectors=_disabled(config),
        profile=Profile(config.metrics_profile),
    )


def _disabled(config: InstanceConfig) -> List[str]:
    """`collect_processes: false` is the same as `processes` in disabled_collectors."""
    disabled = list(config.disabled_collectors)
    if not config.collect_processes and "processes" not in disabled:
        disabled.append("processes")
    return disabled


def _mode(kubernetes: Union[str, bool]) -> str:
    if isinstance(kubernetes, bool):
        return "true" if kubernetes else "false"
    return kubernetes


def kubelet_arguments(config: InstanceConfig) -> Dict[str, Any]:
    """KubeletClient arguments: the instance's options, else the Agent's kubelet settings, else defaults."""
    tls_verify = config.kubelet_tls_verify
    if tls_verify is None:
        agent_value = _agent_config("kubelet_tls_verify")
        tls_verify = True if agent_value is None else is_affirmative(agent_value)
    return {
        "url": _pods_url(config.kubelet_url) if config.kubelet_url else _agent_url(),
        "token_path": config.kubelet_token_path or _agent_config("kubelet_auth_token_path") or DEFAULT_TOKEN_PATH,
        "ca_path": config.kubelet_ca_path or _agent_config("kubelet_client_ca") or DEFAULT_CA_PATH,
        "tls_verify": tls_verify,
        "ttl": config.pod_cache_ttl,
        "timeout": config.kubelet_timeout,
    }


def _agent_config(key: str) -> Any:
    """The Agent's setting, or None where it has none (the Agent answers '' for unset keys)."""
    value = datadog_agent.get_config(key)
    return None if value in (None, "") else value


def _agent_url() -> str:
    host = _agent_config("kubernetes_kubelet_host") or os.environ.get("DD_KUBERNETES_KUBELET_HOST") or DEFAULT_HOST
    port = _agent_config("kubernetes_https_kubelet_port") or DEFAULT_PORT
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"https://{host}:{int(port)}/pods"


def _pods_url(url: str) -> str:
    """`kubelet_url` with `/pods` added when it names only the kubelet."""
    return url if urlsplit(url).path not in ("", "/") else url.rstrip("/") + "/pods"
