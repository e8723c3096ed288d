"""What the check uses, derived once from its validated instance: options folded into one another,
defaults that depend on the host or on the Agent, and a simulated node's stand-ins."""

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Union
from urllib.parse import urlsplit

from datadog_checks.base import is_affirmative

from gpu_monitoring.config_models import InstanceConfig

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
class CheckSettings:
    source: str
    sidecar_socket: str
    ignore_missing_sidecar: bool
    nvml_library_path: Optional[str]
    simulate: Optional[str]
    collect_processes: bool
    disabled_collectors: List[str]
    metrics_profile: str
    xid_ignore: List[int]
    temperature_margin: float
    fabric_registration_grace: float  # seconds from the check's start
    tags: List[str]
    kubernetes: str  # auto | true | false
    kubelet: Dict[str, Any]  # KubeletClient arguments
    pod_resources_socket: str
    gpu_resource_names: List[str]
    dcgm_exporter_url: str  # auto | none | an http(s) URL
    proc_root: str
    sysfs_root: str
    expected_gpus: Optional[int]
    expected_network_ports: Union[str, int]  # auto | a count
    expected_network_rate: Union[str, float]  # auto | Gb/s
    network_ports_exclude: List[str]
    fault_hold: float  # seconds; 0: nothing is held
    max_processes_per_device: int
    hourly_price: Dict[str, float]
    default_hourly_price: Optional[float]
    effective_threshold: float


def derive(config: InstanceConfig, standing_in: Optional[Mapping[str, Any]] = None) -> CheckSettings:
    """The settings of a validated instance. `standing_in` holds a simulated node's values (its proc
    root, prices, kubelet and pod-resources socket) for the options the instance does not set."""
    if standing_in:
        config = config.model_copy(update={k: v for k, v in standing_in.items() if k not in config.model_fields_set})
    return CheckSettings(
        source=config.source,
        sidecar_socket=config.sidecar_socket,
        ignore_missing_sidecar=config.ignore_missing_sidecar,
        nvml_library_path=config.nvml_library_path,
        simulate=config.simulate,
        collect_processes=config.collect_processes,
        disabled_collectors=_disabled(config),
        metrics_profile=config.metrics_profile,
        xid_ignore=list(config.xid_ignore),
        temperature_margin=config.temperature_margin,
        fabric_registration_grace=config.fabric_registration_grace,
        tags=list(config.tags or ()),
        kubernetes=_mode(config.kubernetes),
        kubelet=kubelet_settings(config),
        pod_resources_socket=config.pod_resources_socket,
        gpu_resource_names=list(config.gpu_resource_names),
        dcgm_exporter_url=config.dcgm_exporter_url,
        proc_root=config.proc_root or default_proc_root(),
        sysfs_root=config.sysfs_root,
        expected_gpus=config.expected_gpus,
        expected_network_ports=config.expected_network_ports,
        expected_network_rate=config.expected_network_rate,
        network_ports_exclude=list(config.network_ports_exclude),
        fault_hold=config.fault_hold,
        max_processes_per_device=config.max_processes_per_device,
        hourly_price=dict(config.hourly_price),
        default_hourly_price=config.default_hourly_price,
        effective_threshold=config.effective_threshold,
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


def default_proc_root() -> str:
    """The host's /proc: mounted at /host/proc in the Agent's container, else this machine's own."""
    return "/host/proc" if os.path.isdir("/host/proc") else "/proc"


def kubelet_settings(config: InstanceConfig) -> Dict[str, Any]:
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
