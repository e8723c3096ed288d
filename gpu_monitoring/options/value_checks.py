"""The kinds of value an option takes: each checks its type and range, with an error that names the
option and what it accepts. options.rules says which option takes which; the models and the sidecar's
command line (whose install has no datadog_checks.base) both check with them."""

import math
from typing import Any, Dict, List, Optional, Sequence
from urllib.parse import urlsplit

# sockaddr_un holds 108 bytes with the terminating NUL: a longer path cannot be bound or connected.
MAX_SOCKET_PATH_BYTES = 107


class OptionError(Exception):
    """A value an option refuses: the message names the option; `requirement` says what it accepts. The
    models raise it as a ConfigurationError; not a ValueError, which pydantic would wrap in its report."""

    def __init__(self, name: str, requirement: str) -> None:
        super().__init__(f"`{name}` {requirement}")
        self.requirement = requirement


def text(name: str, value: Any) -> str:
    # A NUL cannot be in a path or a URL: the OS calls fail on it at every run instead.
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise OptionError(name, f"must be a non-empty string; got {value!r}")
    return value


def socket_path(name: str, value: Any) -> str:
    """A unix socket's path, short enough for AF_UNIX."""
    text(name, value)
    if len(value.encode("utf-8", "surrogateescape")) > MAX_SOCKET_PATH_BYTES:
        raise OptionError(name, f"must be a unix socket path of at most {MAX_SOCKET_PATH_BYTES} bytes; got {value!r}")
    return value


def absolute_path(name: str, value: Any, example: str) -> str:
    """A path from the root: a relative one would name a file in whatever directory the reader runs in.
    Printable only: a newline or a tab in a path typed in YAML is a typo."""
    if not isinstance(value, str) or not value.startswith("/") or not value.isprintable():
        raise OptionError(name, f"must be an absolute path such as {example}; got {value!r}")
    return value


def url(name: str, value: Any, example: str) -> str:
    """An http(s) URL with a host and, if any, a numeric port in range."""
    text(name, value)
    try:
        parts = urlsplit(value)
        # `.port` raises ValueError for a port that is not a number in 0-65535.
        port_ok = parts.port is None or parts.port > 0
        good = port_ok and parts.scheme in ("http", "https") and bool(parts.hostname) and value.isprintable()
    except ValueError:
        good = False
    if not good or any(c.isspace() for c in value):
        raise OptionError(name, f"must be an http(s) URL such as {example}; got {value!r}")
    return value


def choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """One of a few words."""
    if value not in choices:
        raise OptionError(name, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionError(name, f"must be true or false; got {value!r}")
    return value


def number(
    name: str, value: Any, minimum: float, maximum: Optional[float] = None, integer: bool = False,
    strict: bool = False,
) -> float:
    """A number in range; `strict` excludes the minimum itself (a timeout of 0 fails every request)."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not _in_range(value, minimum, maximum, strict):
        what = "an integer" if integer else "a finite number"
        bounds = (">" if strict else ">=") + f" {minimum:g}" + (f" and <= {maximum:g}" if maximum is not None else "")
        raise OptionError(name, f"must be {what} {bounds}; got {value!r}")
    return value


def _in_range(value: float, minimum: float, maximum: Optional[float], strict: bool) -> bool:
    try:
        # NaN passes every comparison's negation and inf every minimum: neither means anything here.
        finite = math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False
    above = value > minimum if strict else value >= minimum
    return finite and above and (maximum is None or value <= maximum)


def _list(name: str, value: Any) -> list:
    if not isinstance(value, list):
        raise OptionError(name, f"must be a list; got {value!r}")
    return value


def strings(name: str, value: Any) -> List[str]:
    values = _list(name, value)
    if not all(isinstance(v, str) and v.strip() for v in values):
        raise OptionError(name, f"must be a list of non-empty strings; got {values!r}")
    return values


def integers(name: str, value: Any) -> List[int]:
    values = _list(name, value)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise OptionError(name, f"must be a list of positive integers (XID codes); got {values!r}")
    return values


def names(name: str, value: Any, allowed: Sequence[str]) -> List[str]:
    values = strings(name, value)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise OptionError(name, f"has unknown collectors {unknown}; choose from {', '.join(allowed)}")
    return values


def prices(name: str, value: Any, maximum: float) -> Dict[str, float]:
    """Non-blank names (GPU models or globs) mapped to finite numbers from 0 to `maximum`."""
    if not isinstance(value, dict) or not all(_price(k, v, maximum) for k, v in value.items()):
        raise OptionError(
            name, f"must map GPU model names or globs to finite prices >= 0 and <= {maximum:g} "
            f"(e.g. 'NVIDIA H100*': 4.5); got {value!r}"
        )
    return value


def _price(model: Any, price: Any, maximum: float) -> bool:
    if not isinstance(model, str) or not model.strip() or price is None:
        return False
    try:
        number("price", price, 0, maximum)
    except OptionError:
        return False
    return True
