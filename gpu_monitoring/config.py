"""Instance options: read, checked and defaulted once, with errors that name the option."""

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from datadog_checks.base import ConfigurationError

from .collectors import COLLECTOR_NAMES
from .kube.kubelet import kubelet_settings
from .options import boolean, integers, names, number, strings, text
from .sidecar.protocol import DEFAULT_SOCKET

SOURCES = ("local", "sidecar")
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class InstanceConfig:
    source: str = "local"
    sidecar_socket: str = DEFAULT_SOCKET
    ignore_missing_sidecar: bool = False
    nvml_library_path: Optional[str] = None
    simulate: Optional[str] = None
    collect_processes: bool = True
    disabled_collectors: List[str] = field(default_factory=list)
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
    options: Dict[str, Any] = {}
    source = instance.get("source", "local")
    if source not in SOURCES:
        raise ConfigurationError(f"`source` must be one of {', '.join(SOURCES)}; got {source!r}")
    options["source"] = source
    options["sidecar_socket"] = text(instance, "sidecar_socket", DEFAULT_SOCKET)
    options["ignore_missing_sidecar"] = boolean(instance, "ignore_missing_sidecar", False)
    for name in ("nvml_library_path", "simulate"):
        options[name] = text(instance, name, None)
    if source == "sidecar" and (options["simulate"] or options["nvml_library_path"]):
        raise ConfigurationError(
            "`simulate` and `nvml_library_path` belong to the sidecar when `source` is sidecar: "
            "give them to `gpu-monitoring sidecar` instead"
        )
    options["collect_processes"] = boolean(instance, "collect_processes", True)
    options["disabled_collectors"] = names(instance, "disabled_collectors", COLLECTOR_NAMES)
    options["xid_ignore"] = integers(instance, "xid_ignore")
    options["temperature_margin"] = number(instance, "temperature_margin", 5.0, minimum=0)
    options["tags"] = strings(instance, "tags")
    options.update(_kubernetes(instance))
    options["proc_root"] = text(instance, "proc_root", default_proc_root())
    cap = number(instance, "max_processes_per_device", 64, minimum=0, integer=True)
    options["max_processes_per_device"] = int(cap)
    options["hourly_price"] = _prices(instance)
    price = instance.get("default_hourly_price")
    options["default_hourly_price"] = None if price is None else number(instance, "default_hourly_price", 0, 0)
    options["effective_threshold"] = number(instance, "effective_threshold", 50.0, minimum=0, maximum=100)
    if not options["collect_processes"] and "processes" not in options["disabled_collectors"]:
        options["disabled_collectors"] = options["disabled_collectors"] + ["processes"]
    return InstanceConfig(**options)


def default_proc_root() -> str:
    """The host's /proc: mounted at /host/proc in the Agent's container, else this machine's own."""
    return "/host/proc" if os.path.isdir("/host/proc") else "/proc"


def _kubernetes(instance: Mapping[str, Any]) -> Dict[str, Any]:
    mode = instance.get("kubernetes", "auto")
    mode = {True: "true", False: "false"}.get(mode, mode)
    if mode not in ("auto", "true", "false"):
        raise ConfigurationError(f"`kubernetes` must be auto, true or false; got {mode!r}")
    return {
        "kubernetes": mode,
        "kubelet": kubelet_settings(instance),
        "pod_resources_socket": text(instance, "pod_resources_socket", DEFAULT_POD_RESOURCES_SOCKET),
        "gpu_resource_names": strings(instance, "gpu_resource_names"),
    }


def _prices(instance: Mapping[str, Any]) -> Dict[str, float]:
    prices = instance.get("hourly_price")
    if prices is None:
        return {}
    if not isinstance(prices, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
        for k, v in prices.items()
    ):
        raise ConfigurationError(
            "`hourly_price` must map GPU model names or globs to prices >= 0 "
            f"(e.g. 'NVIDIA H100*': 4.5); got {prices!r}"
        )
    return {k: float(v) for k, v in prices.items()}
