"""The only layer that imports pynvml, and its face: what the collectors and the node reader use is
exported here, and they import it from here (tests/test_nvml_face.py holds them to it).

The face is a GPU as `NvmlDevice` methods that return plain Python values (`temperature()`,
`memory_info()`, `fabric_status()`...), the batched field values a run reads (`Readings`, whose keys
a collector declares with `field()`), and the few samplers and watchers that keep state between
runs (`GpmSampler`, `EventWatcher`). Behind it: `library`, the one way into pynvml's functions; the
calls (`queries`, `processes`, `fabric`, with the room array queries keep in `array_room`); the field
table, its batch and its fallbacks (`readings`, `fields`, `fallbacks`); sessions (`session`) and
what the layer raises (`errors`, imported from its module: it needs no pynvml).

The face is imported when first used, not with this package, so that `errors` can be imported in an
Agent without pynvml: sidecar mode runs there.
"""

import importlib
from typing import Any

# Each name of the face, and the module behind it.
FACE = {
    "NvmlDevice": "device",
    "CLOCK_EVENT_REASONS": "queries",
    "NvmlSession": "session",
    "Readings": "readings",
    "field": "readings",
    "c2c_link_count": "readings",
    "CLOCK_EVENT_TIMES": "readings",
    "ECC_LOCATIONS": "readings",
    "CRC_LINKS": "readings",
    "FEC_BINS": "readings",
    "FieldKey": "fields",
    "Values": "fields",
    "EventWatcher": "events",
    "RawEvent": "events",
    "GpmSampler": "gpm",
    "GpmMetric": "gpm",
    "FabricStatus": "fabric",
    "Listed": "processes",
    "Usage": "processes",
}
__all__ = sorted(FACE)


def __getattr__(name: str) -> Any:
    module = FACE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return value

