"""Reading one instance option: its type and range checked, with an error that names the option."""

from typing import Any, List, Mapping, Optional

from datadog_checks.base import ConfigurationError


def text(instance: Mapping[str, Any], name: str, default: Optional[str] = None) -> Optional[str]:
    value = instance.get(name)
    if value is None:
        # An option left empty in YAML (`proc_root:`) is the same as one not given.
        return default
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"`{name}` must be a non-empty string; got {value!r}")
    return value


def boolean(instance: Mapping[str, Any], name: str, default: Optional[bool]) -> Optional[bool]:
    """True or false; the default (which may be None: "not said") when the option is absent."""
    value = instance.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigurationError(f"`{name}` must be true or false; got {value!r}")
    return value


def number(
    instance: Mapping[str, Any], name: str, default: float, minimum: float,
    maximum: Optional[float] = None, integer: bool = False,
) -> float:
    value = instance.get(name, default)
    kinds = (int,) if integer else (int, float)
    bad = isinstance(value, bool) or not isinstance(value, kinds) or value < minimum
    if bad or (maximum is not None and value > maximum):
        what = "an integer" if integer else "a number"
        bounds = f">= {minimum:g}" + (f" and <= {maximum:g}" if maximum is not None else "")
        raise ConfigurationError(f"`{name}` must be {what} {bounds}; got {value!r}")
    return float(value)


def _list(instance: Mapping[str, Any], name: str) -> list:
    value = instance.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigurationError(f"`{name}` must be a list; got {value!r}")
    return value


def strings(instance: Mapping[str, Any], name: str) -> List[str]:
    values = _list(instance, name)
    if not all(isinstance(v, str) for v in values):
        raise ConfigurationError(f"`{name}` must be a list of strings; got {values!r}")
    return values


def integers(instance: Mapping[str, Any], name: str) -> List[int]:
    values = _list(instance, name)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ConfigurationError(f"`{name}` must be a list of positive integers (XID codes); got {values!r}")
    return values


def names(instance: Mapping[str, Any], name: str, allowed) -> List[str]:
    values = strings(instance, name)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ConfigurationError(f"`{name}` has unknown collectors {unknown}; choose from {', '.join(allowed)}")
    return values
