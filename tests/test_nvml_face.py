"""The nvml layer's face: collectors use `gpu_monitoring.nvml` (and its `errors`) only, the face
exports what it says, and it is loaded when first used, so an Agent without pynvml can still import
the layer's errors (sidecar mode)."""

import subprocess
import sys

import pytest

import gpu_monitoring.nvml as face

from .test_package_structure import PACKAGE, imported, modules

COLLECTORS = "gpu_monitoring.collectors"
ALLOWED = {"gpu_monitoring.nvml", "gpu_monitoring.nvml.errors"}


def test_collectors_reach_the_nvml_layer_through_its_face_only():
    found = modules()
    known = set(found)
    behind = [
        f"{path.relative_to(PACKAGE.parent)} imports {target}"
        for name, (path, tree) in found.items() if name.startswith(COLLECTORS)
        for target in imported(name, path, tree, known)
        if target.startswith("gpu_monitoring.nvml") and target not in ALLOWED
    ]
    assert behind == []


def test_collectors_read_nothing_of_pynvml():
    sources = {path.name: path.read_text() for path in (PACKAGE / "collectors").glob("*.py")}
    assert [name for name, text in sources.items() if "import pynvml" in text] == []


def test_every_name_of_the_face_is_there():
    assert face.__all__ == sorted(face.FACE)
    for name in face.__all__:
        assert getattr(face, name) is not None, name
    with pytest.raises(AttributeError, match="has no attribute 'Device'"):
        face.Device  # noqa: B018 (the old name of NvmlDevice)


def test_the_errors_and_the_face_import_without_pynvml():
    """pynvml made unimportable, as in an Agent that lacks it: the errors load, the face only when used."""
    probe = ("import sys; sys.modules['pynvml'] = None\n"
             "import gpu_monitoring.nvml as face\n"
             "from gpu_monitoring.nvml.errors import NvmlError\n"
             "try:\n    face.NvmlDevice\nexcept ImportError:\n    print('face needs pynvml')\n")
    answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == "face needs pynvml"
