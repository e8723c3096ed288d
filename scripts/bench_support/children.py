"""Child processes for measurements that need a process of their own.

A fork server that has already imported the check starts each child in milliseconds where
`spawn` would spend a second importing it again; children forked from it share nothing with
the bench's own process (pynvml's loaded library, audit hooks, the heap tracemalloc sees).
"""

import multiprocessing
from typing import Any

# `__main__` too: a child would otherwise run the bench's entry script again to rebuild its main module.
_PRELOAD = ["__main__", "bench_support.harness"]


def context() -> Any:
    found = multiprocessing.get_context("forkserver")
    found.set_forkserver_preload(_PRELOAD)
    return found
