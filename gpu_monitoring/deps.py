"""Local mode's packages that the Agent does not ship, imported only where they are needed.

Sidecar mode runs on the Agent's own Python; local mode needs NVML's bindings (and gRPC for the
kubelet's pod-resources API). A missing one is reported with the command that adds it.
"""

import importlib
from types import ModuleType

from gpu_monitoring.__about__ import DEPS

AGENT_PIP = "/opt/datadog-agent/embedded/bin/pip"
AGENT_CONSTRAINTS = "/opt/datadog-agent/final_constraints-py3.txt"


class MissingPackage(ImportError):
    """A package local mode needs is not installed; the message says which and how to add it."""

    def __init__(self, module: str, error: ImportError):
        self.package = DEPS[module].split("==")[0]
        super().__init__(
            f"the Python package {self.package} (module {module}) cannot be imported ({error}); local mode needs it, "
            f"sidecar mode does not. Add it to the Agent with: {install_command(module)}")


def require(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingPackage(module, e) from None


def install_command(module: str) -> str:
    """The command that adds `module`'s package to the Agent, held to the Agent's own pins."""
    return f"sudo -Hu dd-agent {AGENT_PIP} install --constraint {AGENT_CONSTRAINTS} '{DEPS[module]}'"
