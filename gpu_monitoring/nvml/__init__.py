"""The only layer that imports pynvml. `library` is its one way into pynvml's functions: every
call NVML answers goes through it, and a device's go through `Device.ask` (`device`), which
learns what the device refuses. The rest declare what is asked and read the answers: the calls
(`queries`, `processes`, with the room array queries keep in `listing`), field-backed values and
their fallbacks (`readings`, `fields`, `fallbacks`), GPM samplers (`gpm`), event sets (`events`),
sessions (`session`) and what the layer raises (`errors`). Outside `library` these modules read
pynvml's constants and structure layouts only (tests/test_package_structure.py holds them to it).

Its modules are imported by name, not through this package, so that `errors` (which needs no
pynvml) can be imported in an Agent that does not have pynvml: sidecar mode runs there.
"""
