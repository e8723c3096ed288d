"""Every rule of init_config and of an instance, run by the generated models before their types:
`initialize_shared` and `initialize_instance` refuse an option no one reads and check each one given
by its rule (options.rules); `check_instance` checks across options once each is valid.

A refusal is raised as a ConfigurationError, which pydantic passes on as it is: the message names the
option and what it accepts, in one line, where pydantic's own would be wrapped in its error report."""

import difflib
from typing import Any, Collection, Dict

from datadog_checks.base import ConfigurationError

from gpu_monitoring.config_models import defaults
from gpu_monitoring.options.rules import RULES

# The names spec.yaml gives the options: `make config` writes them, since this module cannot ask the models.
from gpu_monitoring.options.spec_options import KNOWN_OPTIONS, KNOWN_SHARED_OPTIONS
from gpu_monitoring.options.value_checks import OptionError


def initialize_shared(values: Dict[str, Any], **kwargs: Any) -> Dict[str, Any]:
    """init_config: an instance's option there would be ignored without a word."""
    for name in values:
        if name in KNOWN_OPTIONS and name not in KNOWN_SHARED_OPTIONS:
            raise ConfigurationError(f"`{name}` is an instance option: set it in each instance, not in init_config")
    unknown(values, KNOWN_SHARED_OPTIONS, section="init_config")
    return {name: _checked(name, value, "shared") for name, value in values.items()}


def initialize_instance(values: Dict[str, Any], **kwargs: Any) -> Dict[str, Any]:
    unknown(values, KNOWN_OPTIONS)
    return {name: _checked(name, value, "instance") for name, value in values.items()}


def _checked(name: str, value: Any, model: str) -> Any:
    # An option left empty in YAML (`sidecar_socket:`) is its default, as if it were not given.
    if value is None:
        return getattr(defaults, f"{model}_{name}", lambda: None)()
    rule = RULES.get(name)
    try:
        return value if rule is None else rule(name, value)
    except OptionError as e:
        raise ConfigurationError(str(e)) from None


def unknown(options: Dict[str, Any], known: Collection[str], section: str = "") -> None:
    """Refuses an option no one reads: a misspelt one would otherwise be its default without a word.
    `section` names where it was given when that is not an instance (`init_config`)."""
    for name in options:
        if name in known or _tooling(name):
            continue
        close = difflib.get_close_matches(str(name), sorted(known), n=1)
        hint = f"did you mean `{close[0]}`?" if close else "conf.yaml.example lists the options"
        raise ConfigurationError(f"unknown {section + ' ' if section else ''}option `{name}`; {hint}")


def _tooling(name: Any) -> bool:
    # Datadog's development tooling adds its own: ddev's `__memory_profiling_tags` in an instance, and in
    # init_config what datadog-checks-base reads when `agent check` debugs or profiles a check
    # (AgentCheck.run: `set_breakpoint`, `profile_memory`; utils/agent/memory.py: `profile_memory_*`).
    return isinstance(name, str) and (name.startswith(("__", "profile_memory")) or name == "set_breakpoint")


def check_instance(model: Any) -> Any:
    if model.source == "sidecar" and (model.simulate or model.nvml_library_path):
        raise ConfigurationError(
            "`simulate` and `nvml_library_path` belong to the sidecar when `source` is sidecar: "
            "give them to `gpu-monitoring sidecar` instead"
        )
    return model
