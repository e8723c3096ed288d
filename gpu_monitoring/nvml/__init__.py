"""The only layer that imports pynvml. Its face, what collectors and the node reader import, is a few
modules (tests/test_nvml_face.py holds them to it), each imported from the module that
defines what it needs:

- `device`: a GPU as `NvmlDevice`, whose methods return plain Python values (`temperature()`,
  `memory_info()`, `fabric_status()`...);
- `readings` and `fields`: the batched field values a run reads (`Readings`, `Values`), whose keys a
  collector declares with `field()`;
- `gpm`, `events`: the samplers and watchers that keep state between runs (`GpmSampler`, `EventWatcher`);
- `fabric`, `processes`, `queries`: the values some methods answer with (`FabricStatus`, `Listed`,
  `Usage`, `CLOCK_EVENT_REASONS`);
- `session`: a session of NVML over the node's GPUs; `errors`: what the layer raises.

Behind the face: `library`, the one way into pynvml's functions; `array_room`, the room array queries
keep; `fallbacks`, what a driver that refuses a field is asked instead. Nothing is imported with this
package, so that `errors`, which needs no pynvml, imports in an Agent without it: sidecar mode runs there.
"""
