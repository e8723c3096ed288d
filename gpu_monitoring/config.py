"""Instance options: read, checked and defaulted once, with errors that name the option."""

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from datadog_checks.base import ConfigurationError

from .collectors import COLLECTOR_NAMES
from .config_models import InstanceConfig as InstanceModel
from .kube.kubelet import DEFAULT_TIMEOUT, kubelet_settings
from .metric_spec import DEFAULT_PROFILE, PROFILES
from .options import boolean, choice, integers, names, number, socket_path, strings, text, unknown, url
from .sidecar.protocol import DEFAULT_SOCKET

SOURCES = ("local", "sidecar")
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# Beyond these a value is a typo, not a choice: a margin over any slowdown threshold warns on every
# GPU, a timeout longer than a minute holds the Agent's worker, no currency prices a GPU hour at a
# billion, and no GPU runs a million processes.
MAX_TEMPERATURE_MARGIN = 100
MAX_KUBELET_TIMEOUT = 60
MAX_PRICE = 1e9
MAX_PROCESSES_PER_DEVICE = 1_000_000
# Every option an instance may hold: spec.yaml names them (the check's, and the Agent's own that it
# reads from every instance) and the models are generated from it.
KNOWN_OPTIONS = frozenset(field.alias or name for name, field in InstanceModel.model_fields.items())


@dataclass(frozen=True)
class InstanceConfig:
    source: str = "local"
    sidecar_socket: str = DEFAULT_SOCKET
    ignore_missing_sidecar: bool = False
    nvml_library_path: Optional[str] = None
    simulate: Optional[str] = None
    collect_processes: bool = True
    disabled_collectors: List[str] = field(default_factory=list)
    metrics_profile: str = DEFAULT_PROFILE
    xid_ignore: List[int] = field(default_factory=list)
    temperature_margin: float = 5.0
    tags: List[str] = field(default_factory=list)
    kubernetes: str = "auto"  # auto | true | false
    kubelet: Dict[str, Any] = field(default_factory=dict)  # KubeletClient arguments
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET
    gpu_resource_names: List[str] = field(default_factory=list)
    proc_root: str = "/proc"
    max_processes_per_device: int = 64
    hourly_price: Dict[str, float] = field(default_factory=dict)
    default_hourly_price: Optional[float] = None
    effective_threshold: float = 50.0


def parse(instance: Mapping[str, Any]) -> InstanceConfig:
    """The instance's options, each checked; a ConfigurationError names the first wrong one."""
    unknown(instance, KNOWN_OPTIONS)
    options = _source(instance)
    options.update(_collection(instance))
    options.update(_kubernetes(instance))
    options.update(_judgement(instance))
    _standard(instance)
    return InstanceConfig(**options)


def _source(instance: Mapping[str, Any]) -> Dict[str, Any]:
    source = choice(instance, "source", SOURCES, "local")
    options = {name: text(instance, name, None) for name in ("nvml_library_path", "simulate")}
    if source == "sidecar" and (options["simulate"] or options["nvml_library_path"]):
        raise ConfigurationError(
            "`simulate` and `nvml_library_path` belong to the sidecar when `source` is sidecar: "
            "give them to `gpu-monitoring sidecar` instead"
        )
    options["source"] = source
    options["sidecar_socket"] = socket_path(instance, "sidecar_socket", DEFAULT_SOCKET)
    options["ignore_missing_sidecar"] = boolean(instance, "ignore_missing_sidecar", False)
    return options


def _collection(instance: Mapping[str, Any]) -> Dict[str, Any]:
    options: Dict[str, Any] = {
        "collect_processes": boolean(instance, "collect_processes", True),
        "disabled_collectors": names(instance, "disabled_collectors", COLLECTOR_NAMES),
        "metrics_profile": choice(instance, "metrics_profile", PROFILES, DEFAULT_PROFILE),
        "tags": strings(instance, "tags"),
        "proc_root": text(instance, "proc_root", default_proc_root()),
    }
    cap = number(instance, "max_processes_per_device", 64, 0, MAX_PROCESSES_PER_DEVICE, integer=True)
    options["max_processes_per_device"] = int(cap)
    if not options["collect_processes"] and "processes" not in options["disabled_collectors"]:
        options["disabled_collectors"] = options["disabled_collectors"] + ["processes"]
    return options


def _judgement(instance: Mapping[str, Any]) -> Dict[str, Any]:
    """What turns readings into health, effectiveness and cost."""
    price = instance.get("default_hourly_price")
    return {
        "xid_ignore": integers(instance, "xid_ignore"),
        "temperature_margin": number(instance, "temperature_margin", 5.0, 0, MAX_TEMPERATURE_MARGIN),
        "hourly_price": _prices(instance),
        "default_hourly_price": None if price is None else number(instance, "default_hourly_price", 0, 0, MAX_PRICE),
        "effective_threshold": number(instance, "effective_threshold", 50.0, minimum=0, maximum=100),
    }


def _standard(instance: Mapping[str, Any]) -> None:
    """The Agent's own options, which it would take as they come: NaN as an interval, an empty service."""
    number(instance, "min_collection_interval", 15, minimum=0, strict=True)
    text(instance, "service")


def default_proc_root() -> str:
    """The host's /proc: mounted at /host/proc in the Agent's container, else this machine's own."""
    return "/host/proc" if os.path.isdir("/host/proc") else "/proc"


def _kubernetes(instance: Mapping[str, Any]) -> Dict[str, Any]:
    mode = instance.get("kubernetes")
    if mode is None:
        mode = "auto"
    if isinstance(mode, bool):  # not a dict lookup: 1 and 0 would pass as True and False
        mode = "true" if mode else "false"
    if not isinstance(mode, str) or mode not in ("auto", "true", "false"):
        raise ConfigurationError(f"`kubernetes` must be auto, true or false; got {mode!r}")
    # kubelet_settings checks these too, but not that the URL parses nor that a timeout of 0 is useless.
    url(instance, "kubelet_url", "https://host:10250")
    number(instance, "kubelet_timeout", DEFAULT_TIMEOUT, minimum=0, maximum=MAX_KUBELET_TIMEOUT, strict=True)
    return {
        "kubernetes": mode,
        "kubelet": kubelet_settings(instance),
        "pod_resources_socket": socket_path(instance, "pod_resources_socket", DEFAULT_POD_RESOURCES_SOCKET),
        "gpu_resource_names": strings(instance, "gpu_resource_names"),
    }


def _prices(instance: Mapping[str, Any]) -> Dict[str, float]:
    prices = instance.get("hourly_price")
    if prices is None:
        return {}
    if not isinstance(prices, dict) or not all(_price(k, v) for k, v in prices.items()):
        raise ConfigurationError(
            f"`hourly_price` must map GPU model names or globs to finite prices >= 0 and <= {MAX_PRICE:g} "
            f"(e.g. 'NVIDIA H100*': 4.5); got {prices!r}"
        )
    return {k: float(v) for k, v in prices.items()}


def _price(model: Any, price: Any) -> bool:
    if not isinstance(model, str) or not model.strip() or price is None:
        return False
    try:
        number({"price": price}, "price", 0, 0, MAX_PRICE)
    except ConfigurationError:
        return False
    return True
