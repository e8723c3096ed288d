"""The only layer that imports pynvml: sessions (`session`), devices (`device`), field-backed
values and their fallbacks (`readings`, `fields`, `fallbacks`), one-call array queries (`listing`,
`processes`), GPM samplers (`gpm`), event sets (`events`) and what they raise (`errors`).

Its modules are imported by name, not through this package, so that `errors` (which needs no
pynvml) can be imported in an Agent that does not have pynvml: sidecar mode runs there.
"""
