"""A submitted value as a person reads it, in its metric's unit (metrics.yaml): 74.6 GiB, 1.2 GiB/s, 91%,
400 Gb/s, 3 errors."""

from typing import Optional

from gpu_monitoring.metrics.spec import NAMESPACE, SPEC

BINARY_PREFIXES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
# Datadog's short names for the units it abbreviates; a unit not here (error, device, process) is
# written out, counted.
SUFFIXES = {"percent": "%", "degree celsius": " °C", "megahertz": " MHz", "watt": " W", "joule": " J",
            "second": " s", "gigabit": " Gb"}


def human(metric: str, value: Optional[float]) -> str:
    """`value` of the metric named `metric` (with or without the namespace); "-" for no value."""
    if value is None:
        return "-"
    spec = SPEC.get(metric[len(NAMESPACE) + 1:] if metric.startswith(NAMESPACE + ".") else metric)
    unit, per_unit = (spec.unit, spec.per_unit) if spec else ("", "")
    per = f"/{per_unit[0]}" if per_unit else ""
    if unit == "byte":
        return byte_size(value) + per
    if unit == "dollar":
        return f"${value:,.2f}{per}"
    return number(value) + SUFFIXES.get(unit, counted(unit, value)) + per


def counted(unit: str, value: float) -> str:
    """What follows the number of a unit of things counted: ` error` after 1, ` errors`, ` processes`."""
    if not unit:
        return ""
    if value == 1:
        return f" {unit}"
    return f" {unit}es" if unit.endswith(("s", "sh", "ch", "x")) else f" {unit}s"


def byte_size(value: float) -> str:
    """Binary multiples, as nvidia-smi and Datadog's byte unit show memory: 1 GiB is 1024**3 bytes."""
    scaled, prefix = float(value), 0
    while abs(scaled) >= 1024 and prefix < len(BINARY_PREFIXES) - 1:
        scaled, prefix = scaled / 1024, prefix + 1
    return f"{number(scaled)} {BINARY_PREFIXES[prefix]}"


def number(value: float) -> str:
    """Every digit of a whole number (with thousands separators), else three significant digits."""
    if float(value).is_integer():
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
