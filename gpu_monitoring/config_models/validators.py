"""Every rule of an instance, run by the generated models: `initialize_instance` on the raw instance,
`instance_<option>` on each option it sets, `check_instance` across options once each is valid.

A rule raises ConfigurationError itself, which pydantic passes on as it is: the message names the
option and what it accepts, in one line, where pydantic's own would be wrapped in its error report."""

from functools import partial
from typing import Any, Callable, Dict

from datadog_checks.base import ConfigurationError

from gpu_monitoring.collectors import COLLECTOR_NAMES
from gpu_monitoring.config.value_checks import (
    boolean,
    choice,
    integers,
    names,
    number,
    prices,
    socket_path,
    strings,
    text,
    unknown,
    url,
)
from gpu_monitoring.config_models import defaults

# Every option an instance may hold (the check's, and the Agent's own that it reads from every
# instance): `make config` writes them from spec.yaml, since this module cannot ask the model.
from gpu_monitoring.config_models.known_options import KNOWN_OPTIONS
from gpu_monitoring.metrics.spec import PROFILES

SOURCES = ("local", "sidecar")
KUBERNETES_MODES = ("auto", "true", "false")
DCGM_EXPORTER_MODES = ("auto", "none")
# Beyond these a value is a typo, not a choice: a margin over any slowdown threshold warns on every
# GPU, a timeout longer than a minute holds the Agent's worker, no currency prices a GPU hour at a
# billion, and no GPU runs a million processes.
MAX_TEMPERATURE_MARGIN = 100
MAX_KUBELET_TIMEOUT = 60
MAX_PRICE = 1e9
MAX_PROCESSES_PER_DEVICE = 1_000_000
# A fabric manager registers a rack's GPUs within minutes of the driver loading; a day is a typo.
MAX_FABRIC_REGISTRATION_GRACE = 86400
# The largest nodes hold tens of GPUs and ports (an NVL72 rack is 18 trays of 4); a thousand is a typo,
# as is a port faster than 10 Tb/s or a verdict held past a month.
MAX_EXPECTED = 1024
MAX_NETWORK_RATE = 10000
MAX_FAULT_HOLD = 30 * 86400
AUTO = "auto"


def kubernetes(name: str, value: Any) -> Any:
    # YAML's booleans are words too; not a lookup in a dict: 1 and 0 would pass as True and False.
    if isinstance(value, bool) or (isinstance(value, str) and value in KUBERNETES_MODES):
        return value
    raise ConfigurationError(f"`{name}` must be auto, true or false; got {value!r}")


def dcgm_exporter_url(name: str, value: Any) -> str:
    if value in DCGM_EXPORTER_MODES:
        return value
    return url(name, value, example="http://<POD_IP>:9400/metrics, auto or none")


def automatic(name: str, value: Any, maximum: float, integer: bool) -> Any:
    """`auto`, or a number from 1 (0 for a count) to `maximum`."""
    if value == AUTO:
        return value
    try:
        return number(name, value, minimum=0 if integer else 1, maximum=maximum, integer=integer)
    except ConfigurationError:
        what = "an integer from 0" if integer else "a number from 1"
        raise ConfigurationError(f"`{name}` must be auto or {what} to {maximum:g}; got {value!r}") from None


# The check's options; the Agent's own that the models check by their type are not here.
RULES: Dict[str, Callable[[str, Any], Any]] = {
    "source": partial(choice, choices=SOURCES),
    "sidecar_socket": socket_path,
    "ignore_missing_sidecar": boolean,
    "nvml_library_path": text,
    "simulate": text,
    "collect_processes": boolean,
    "disabled_collectors": partial(names, allowed=COLLECTOR_NAMES),
    "metrics_profile": partial(choice, choices=PROFILES),
    "tags": strings,
    "proc_root": text,
    "max_processes_per_device": partial(number, minimum=0, maximum=MAX_PROCESSES_PER_DEVICE, integer=True),
    "xid_ignore": integers,
    "temperature_margin": partial(number, minimum=0, maximum=MAX_TEMPERATURE_MARGIN),
    "fabric_registration_grace": partial(number, minimum=0, maximum=MAX_FABRIC_REGISTRATION_GRACE),
    "hourly_price": partial(prices, maximum=MAX_PRICE),
    "default_hourly_price": partial(number, minimum=0, maximum=MAX_PRICE),
    "effective_threshold": partial(number, minimum=0, maximum=100),
    "kubernetes": kubernetes,
    # The URL's parts too, and that a timeout of 0 is useless.
    "kubelet_url": partial(url, example="https://host:10250"),
    "kubelet_token_path": text,
    "kubelet_ca_path": text,
    "kubelet_tls_verify": boolean,
    "kubelet_timeout": partial(number, minimum=0, maximum=MAX_KUBELET_TIMEOUT, strict=True),
    "pod_cache_ttl": partial(number, minimum=0),
    "pod_resources_socket": socket_path,
    "gpu_resource_names": strings,
    "dcgm_exporter_url": dcgm_exporter_url,
    "sysfs_root": text,
    "expected_gpus": partial(number, minimum=1, maximum=MAX_EXPECTED, integer=True),
    "expected_network_ports": partial(automatic, maximum=MAX_EXPECTED, integer=True),
    "expected_network_rate": partial(automatic, maximum=MAX_NETWORK_RATE, integer=False),
    "network_ports_exclude": strings,
    "fault_hold": partial(number, minimum=0, maximum=MAX_FAULT_HOLD),
    # The Agent's own, which it would take as they come: NaN as an interval, an empty service.
    "min_collection_interval": partial(number, minimum=0, strict=True),
    "service": text,
}


def initialize_instance(values: Dict[str, Any], **kwargs: Any) -> Dict[str, Any]:
    unknown(values, KNOWN_OPTIONS)
    return values


def check_instance(model: Any) -> Any:
    if model.source == "sidecar" and (model.simulate or model.nvml_library_path):
        raise ConfigurationError(
            "`simulate` and `nvml_library_path` belong to the sidecar when `source` is sidecar: "
            "give them to `gpu-monitoring sidecar` instead"
        )
    return model


def _validator(name: str) -> Callable[..., Any]:
    default = getattr(defaults, f"instance_{name}", lambda: None)
    rule = RULES.get(name)

    def validate(value: Any, **kwargs: Any) -> Any:
        # An option left empty in YAML (`sidecar_socket:`) is its default, as if it were not given.
        if value is None:
            return default()
        return value if rule is None else rule(name, value)

    return validate


# The models call `instance_<option>` for each option an instance sets.
globals().update(
    {
        f"instance_{name}": _validator(name)
        for name in {*RULES, *(d.removeprefix("instance_") for d in dir(defaults) if d.startswith("instance_"))}
    }
)
