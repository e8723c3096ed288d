"""The rule of each option: the kind of value it takes (options.value_checks) with its choices and bounds.
The models run them (config_models/validators.py), and the sidecar's command line checks its flags with
them too (gpu_monitoring.sidecar.command): neither this module nor the sidecar needs pydantic."""

from functools import partial
from typing import Any, Callable, Dict, Sequence

from gpu_monitoring.options.spec_options import CHOICES
from gpu_monitoring.options.value_checks import (
    OptionError,
    absolute_path,
    boolean,
    choice,
    integers,
    names,
    number,
    prices,
    socket_path,
    strings,
    text,
    url,
)

Rule = Callable[[str, Any], Any]

DCGM_EXPORTER_MODES = ("auto", "none")
EXPORTER_EXAMPLE = "http://<POD_IP>:9400/metrics"
# auto: /dev/kmsg where it can be read; none: no kernel log; else the path of a log the host keeps.
KERNEL_LOG_AUTO, KERNEL_LOG_NONE = "auto", "none"
KERNEL_LOG_MODES = (KERNEL_LOG_AUTO, KERNEL_LOG_NONE)
KERNEL_LOG_EXAMPLE = "/var/log/kern.log"
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


def kubernetes(name: str, value: Any) -> Any:
    # YAML's booleans are words too; not a lookup in a dict: 1 and 0 would pass as True and False.
    modes = CHOICES["kubernetes"]
    if isinstance(value, bool) or (isinstance(value, str) and value in modes):
        return value
    raise OptionError(name, f"must be {', '.join(modes[:-1])} or {modes[-1]}; got {value!r}")


def exporter_url(name: str, value: Any) -> str:
    """A dcgm-exporter's `/metrics` URL."""
    return url(name, value, example=EXPORTER_EXAMPLE)


def dcgm_exporter_url(name: str, value: Any) -> str:
    if value in DCGM_EXPORTER_MODES:
        return value
    return url(name, value, example=f"{EXPORTER_EXAMPLE}, {' or '.join(DCGM_EXPORTER_MODES)}")


def kernel_log(name: str, value: Any) -> str:
    """`auto`, `none`, or the absolute path of a log: /dev/kmsg, a file of its records, or a text log."""
    if isinstance(value, str) and value in KERNEL_LOG_MODES:
        return value
    try:
        return absolute_path(name, value, example=KERNEL_LOG_EXAMPLE)
    except OptionError:
        modes = ", ".join(KERNEL_LOG_MODES)
        raise OptionError(name, f"must be {modes} or an absolute path such as {KERNEL_LOG_EXAMPLE}; "
                                f"got {value!r}") from None


def automatic(name: str, value: Any, words: Sequence[str], maximum: float, integer: bool) -> Any:
    """One of `words` (`auto`), or a number from 1 (0 for a count) to `maximum`."""
    if value in words:
        return value
    try:
        return number(name, value, minimum=0 if integer else 1, maximum=maximum, integer=integer)
    except OptionError:
        what = "an integer from 0" if integer else "a number from 1"
        raise OptionError(name, f"must be {' or '.join(words)} or {what} to {maximum:g}; got {value!r}") from None


# The rule of each option; those of the Agent's own that are not here are checked by the models' types.
RULES: Dict[str, Rule] = {
    "source": partial(choice, choices=CHOICES["source"]),
    "sidecar_socket": socket_path,
    "ignore_missing_sidecar": boolean,
    "nvml_library_path": text,
    "simulate": text,
    "collect_processes": boolean,
    "disabled_collectors": partial(names, allowed=CHOICES["disabled_collectors"]),
    "metrics_profile": partial(choice, choices=CHOICES["metrics_profile"]),
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
    "kernel_log": kernel_log,
    "expected_gpus": partial(number, minimum=1, maximum=MAX_EXPECTED, integer=True),
    "expected_network_ports": partial(automatic, words=CHOICES["expected_network_ports"], maximum=MAX_EXPECTED,
                                      integer=True),
    "expected_network_rate": partial(automatic, words=CHOICES["expected_network_rate"], maximum=MAX_NETWORK_RATE,
                                     integer=False),
    "network_ports_exclude": strings,
    "fault_hold": partial(number, minimum=0, maximum=MAX_FAULT_HOLD),
    # The Agent's own, which it would take as they come: NaN as an interval, an empty service.
    "min_collection_interval": partial(number, minimum=0, strict=True),
    "service": text,
    # Also in init_config, where no other rule of the Agent's applies.
    "loader": text,
    "process_isolation": boolean,
}
