"""The package's structure: no import cycle between its modules nor between its packages, and one way into
pynvml."""

import ast
import ctypes
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pynvml

PACKAGE = Path(__file__).resolve().parents[1] / "gpu_monitoring"
# The nvml layer's one module that calls pynvml's functions and touches its internals.
LIBRARY = "gpu_monitoring.nvml.library"
# The stand-in driver beneath pynvml: it plays the C library, whose constants and layouts it uses.
BENEATH_PYNVML = "gpu_monitoring.simulator"


def modules() -> Dict[str, Tuple[Path, ast.Module]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = (path, ast.parse(path.read_text(), str(path)))
    return found


def imported(name: str, path: Path, tree: ast.Module, known: Set[str]) -> Iterator[str]:
    """The package's modules `name` imports, anywhere in it (in functions and TYPE_CHECKING blocks
    too): `from . import x` names module x, `from .x import y` module x (or x.y where that is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle per strongly connected group of modules that import each other (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def import_graph() -> Dict[str, Set[str]]:
    found = modules()
    graph = {name: set(imported(name, path, tree, set(found))) for name, (path, tree) in found.items()}
    # A package imports its parents when it loads; that is no dependency of the parent on it.
    return {name: {other for other in targets if not name.startswith(other + ".")} for name, targets in graph.items()}


def test_the_walker_sees_relative_absolute_and_nested_imports():
    graph = import_graph()
    assert "gpu_monitoring.nvml.session" in graph["gpu_monitoring.sources"]  # inside a function
    assert "gpu_monitoring.nvml.device" in graph["gpu_monitoring.nvml.readings"]  # from .device import
    assert "gpu_monitoring.nvml.library" in graph["gpu_monitoring.nvml.session"]  # from . import library


def test_no_module_of_the_package_imports_one_that_imports_it_back():
    assert cycles(import_graph()) == []


def package_graph() -> Dict[str, Set[str]]:
    """Which of gpu_monitoring's packages (and top-level modules) import which others."""
    def top(module: str) -> str:
        return ".".join(module.split(".")[:2])

    graph: Dict[str, Set[str]] = {}
    for name, targets in import_graph().items():
        graph.setdefault(top(name), set()).update(top(t) for t in targets if top(t) != top(name))
    return graph


def test_no_package_imports_one_that_imports_it_back():
    # Data flows one way between layers too: a package that needs what another imports from it
    # shares a layer with it, and neither can be read alone.
    assert cycles(package_graph()) == []


def test_the_rules_of_the_options_are_beneath_the_models_and_what_is_derived_above():
    graph = package_graph()
    assert graph["gpu_monitoring.options"] == set()
    assert "gpu_monitoring.options" in graph["gpu_monitoring.config_models"]
    assert "gpu_monitoring.config_models" in graph["gpu_monitoring.config"]


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _is_data(value: object) -> bool:
    """A constant or a ctypes layout: what describes NVML's ABI, as opposed to what calls it."""
    if isinstance(value, (int, float, str, bytes, ctypes._SimpleCData)):
        return True
    return isinstance(value, type) and issubclass(value, (ctypes.Structure, ctypes.Union, ctypes._Pointer))


def pynvml_uses(tree: ast.Module) -> Iterator[Tuple[int, str]]:
    """Every name read from pynvml: `pynvml.name` and `from pynvml import name`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pynvml":
            yield node.lineno, node.attr
        elif isinstance(node, ast.ImportFrom) and node.module == "pynvml":
            yield from ((node.lineno, alias.name) for alias in node.names)


def test_only_the_library_module_calls_into_pynvml():
    """Elsewhere pynvml gives constants and structure layouts only: no function, no exception, no
    private helper, no library handle. So every call, and every error mapping, is the library's."""
    calls = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: pynvml.{attr}"
        for name, (path, tree) in modules().items()
        if name != LIBRARY and not name.startswith(BENEATH_PYNVML)
        for line, attr in pynvml_uses(tree)
        if attr.startswith("_") or not _is_data(getattr(pynvml, attr))
    ]
    assert calls == []


def test_the_rule_tells_a_call_from_a_constant():
    assert _is_data(pynvml.NVML_FI_DEV_MEMORY_TEMP) and _is_data(pynvml.c_nvmlMemory_t)
    assert _is_data(pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong) and _is_data(pynvml.c_nvmlDevice_t)
    assert not _is_data(pynvml.nvmlDeviceGetUUID) and not _is_data(pynvml.NVMLError)
    assert not _is_data(pynvml._nvmlGetFunctionPointer)


def test_the_check_orchestrates_and_reads_nothing_itself():
    # The node, NVML and the kernel's log are read by the source, judged by the judge: the check only
    # opens them and hands each step's output to the next.
    readers = ("gpu_monitoring.node", "gpu_monitoring.collectors", "gpu_monitoring.nvml")
    read_here = {target for target in import_graph()["gpu_monitoring.check"]
                 if target.startswith(readers) and target != "gpu_monitoring.nvml.errors"}
    assert read_here == set()
