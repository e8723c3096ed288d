"""The nvml layer's face: collectors import its face modules only, never what is behind them (the calls
into pynvml, the arrays' room, the field fallbacks), and the layer's errors import without pynvml
(sidecar mode)."""

import subprocess
import sys

from .test_package_structure import PACKAGE, imported, modules

COLLECTORS = "gpu_monitoring.collectors"
FACE = {f"gpu_monitoring.nvml.{name}" for name in
        ("device", "readings", "fields", "gpm", "events", "fabric", "processes", "queries", "session", "errors")}
BEHIND = {"gpu_monitoring.nvml.library", "gpu_monitoring.nvml.array_room", "gpu_monitoring.nvml.fallbacks"}


def test_collectors_reach_the_nvml_layer_through_its_face_only():
    found = modules()
    known = set(found)
    behind = [
        f"{path.relative_to(PACKAGE.parent)} imports {target}"
        for name, (path, tree) in found.items() if name.startswith(COLLECTORS)
        for target in imported(name, path, tree, known)
        if target.startswith("gpu_monitoring.nvml") and target not in FACE
    ]
    assert behind == []


def test_the_face_and_what_is_behind_it_are_every_module_of_the_layer():
    layer = {name for name in modules() if name.startswith("gpu_monitoring.nvml.")}
    assert layer == FACE | BEHIND


def test_the_package_exports_nothing_and_each_name_is_imported_from_its_module():
    # Jump-to-definition lands on the definition: no re-export, no lazy attribute.
    sources = {path.name: path.read_text() for path in (PACKAGE / "collectors").glob("*.py")}
    assert [name for name, text in sources.items() if "from gpu_monitoring.nvml import" in text] == []
    init = (PACKAGE / "nvml" / "__init__.py").read_text()
    assert "import" not in init.split('"""')[2] and "__getattr__" not in init


def test_collectors_read_nothing_of_pynvml():
    sources = {path.name: path.read_text() for path in (PACKAGE / "collectors").glob("*.py")}
    assert [name for name, text in sources.items() if "import pynvml" in text] == []


def test_the_errors_import_without_pynvml():
    """pynvml made unimportable, as in an Agent that lacks it: the layer's errors load, its device does not."""
    probe = ("import sys; sys.modules['pynvml'] = None\n"
             "import gpu_monitoring.nvml\n"
             "from gpu_monitoring.nvml.errors import NvmlError\n"
             "try:\n    from gpu_monitoring.nvml.device import NvmlDevice\nexcept ImportError:\n"
             "    print('the device needs pynvml')\n")
    answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == "the device needs pynvml"
