"""The check runs inside the Agent's process: nothing of the package starts a program or a shell."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpu_monitoring"
PROCESS_MODULES = {"subprocess", "pty", "multiprocessing"}
PROCESS_CALLS = {"system", "popen", "fork", "forkpty", "execv", "execve", "execvp", "execl", "execlp", "spawnv",
                 "spawnl", "posix_spawn", "posix_spawnp"}


def _offences(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (f"import {a.name}" for a in node.names if a.name.split(".")[0] in PROCESS_MODULES)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PROCESS_MODULES:
            yield f"from {node.module} import ..."
        elif isinstance(node, ast.Attribute) and node.attr in PROCESS_CALLS and getattr(node.value, "id", "") == "os":
            yield f"os.{node.attr}"


def test_no_module_starts_a_process():
    found = {str(path.relative_to(PACKAGE)): list(_offences(path)) for path in PACKAGE.rglob("*.py")}
    assert {name: offences for name, offences in found.items() if offences} == {}
