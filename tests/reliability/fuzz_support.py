"""What the fuzzers share: the example budget and JSON-ish strategies (see test_fuzz_parsers.py).

Budget: both fuzz modules run in about 30 s on 2 cores, the sidecar's start included. Every fuzzer
is `derandomize=True`, so a CI failure reproduces as it is; the example counts are the `*_EXAMPLES`
constants below (300 for a pure parser, 150 for one that builds a check or talks over a socket,
100 requests to a real sidecar). Raise them locally to fuzz harder, e.g. `FUZZ_SCALE=20 pytest ...`.
"""

import copy
import json
import math
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SCALE = max(1, int(os.environ.get("FUZZ_SCALE", "1")))
PARSER_EXAMPLES = 300 * SCALE
CHECK_EXAMPLES = 150 * SCALE
CLIENT_EXAMPLES = 150 * SCALE
SIDECAR_EXAMPLES = 100 * SCALE


def fuzz(examples: int):
    # Fixtures here are module-scoped and hold nothing an example changes, so reusing them is sound.
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


# --- JSON-ish values ------------------------------------------------------------------------

# Lone surrogates are what json.loads makes of "\ud800": text from outside may hold them.
TEXT = st.text(st.characters(categories=None, codec=None), max_size=24)
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats() | st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308, 10**400]) | TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=16)


def _locations(value, path=()):
    """Every place in a JSON document: the root, each key's value, each item."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _locations(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _locations(item, path + (index,))


def mutated(data, document):
    """`document` with one to three places replaced by arbitrary JSON, removed, or wrapped in a list."""
    document = copy.deepcopy(document)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        path = data.draw(st.sampled_from(sorted(_locations(document), key=repr)), label="where")
        how = data.draw(st.sampled_from(["replace", "delete", "wrap", "stringify"]), label="how")
        if not path:
            document = data.draw(JSON, label="root") if how == "replace" else [document]
            continue
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        if how == "delete":
            del parent[last]
        elif how == "wrap":
            parent[last] = [parent[last]]
        elif how == "stringify":
            parent[last] = json.dumps(parent[last])
        else:
            parent[last] = data.draw(JSON, label="value")
    return document


