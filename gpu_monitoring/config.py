"""Instance options: read, checked and defaulted once, with errors that name the option."""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from datadog_checks.base import ConfigurationError

from .collectors import COLLECTOR_NAMES

SOURCES = ("local",)


@dataclass(frozen=True)
class InstanceConfig:
    source: str = "local"
    nvml_library_path: Optional[str] = None
    simulate: Optional[str] = None
    collect_processes: bool = True
    disabled_collectors: List[str] = field(default_factory=list)
    xid_ignore: List[int] = field(default_factory=list)
    temperature_margin: float = 5.0
    tags: List[str] = field(default_factory=list)


def parse(instance: Mapping[str, Any]) -> InstanceConfig:
    options: Dict[str, Any] = {}
    source = instance.get("source", "local")
    if source not in SOURCES:
        raise ConfigurationError(f"`source` must be one of {', '.join(SOURCES)}; got {source!r}")
    options["source"] = source
    for name in ("nvml_library_path", "simulate"):
        value = instance.get(name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigurationError(f"`{name}` must be a non-empty string; got {value!r}")
        options[name] = value
    options["collect_processes"] = _bool(instance, "collect_processes", True)
    options["disabled_collectors"] = _names(instance, "disabled_collectors", COLLECTOR_NAMES)
    options["xid_ignore"] = _ints(instance, "xid_ignore")
    options["temperature_margin"] = _number(instance, "temperature_margin", 5.0, minimum=0)
    options["tags"] = _strings(instance, "tags")
    if not options["collect_processes"] and "processes" not in options["disabled_collectors"]:
        options["disabled_collectors"] = options["disabled_collectors"] + ["processes"]
    return InstanceConfig(**options)


def _bool(instance: Mapping[str, Any], name: str, default: bool) -> bool:
    value = instance.get(name, default)
    if not isinstance(value, bool):
        raise ConfigurationError(f"`{name}` must be true or false; got {value!r}")
    return value


def _number(instance: Mapping[str, Any], name: str, default: float, minimum: float) -> float:
    value = instance.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ConfigurationError(f"`{name}` must be a number >= {minimum:g}; got {value!r}")
    return float(value)


def _list(instance: Mapping[str, Any], name: str) -> list:
    value = instance.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigurationError(f"`{name}` must be a list; got {value!r}")
    return value


def _strings(instance: Mapping[str, Any], name: str) -> List[str]:
    values = _list(instance, name)
    if not all(isinstance(v, str) for v in values):
        raise ConfigurationError(f"`{name}` must be a list of strings; got {values!r}")
    return values


def _ints(instance: Mapping[str, Any], name: str) -> List[int]:
    values = _list(instance, name)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ConfigurationError(f"`{name}` must be a list of positive integers (XID codes); got {values!r}")
    return values


def _names(instance: Mapping[str, Any], name: str, allowed) -> List[str]:
    values = _strings(instance, name)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ConfigurationError(f"`{name}` has unknown collectors {unknown}; choose from {', '.join(allowed)}")
    return values
