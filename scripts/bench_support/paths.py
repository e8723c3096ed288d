"""Source paths shortened for tables: relative to the repository, site-packages or the stdlib."""

import sysconfig
from pathlib import Path

import gpu_monitoring

STDLIB = sysconfig.get_paths()["stdlib"]
# site-packages first: a virtual environment may live inside the repository.
_ROOTS = ("/site-packages/", str(Path(gpu_monitoring.__file__).resolve().parents[1]) + "/", STDLIB + "/")


def short_path(path: str) -> str:
    for root in _ROOTS:
        if root in path:
            return path.split(root, 1)[1]
    return path
