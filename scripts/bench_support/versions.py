"""One version of the code under comparison: its tree, and the child process that measures it there.

The child imports gpu_monitoring and bench_support from the version's own root, ahead of the
package installed into the environment (which may be another tree's, editable), and says which
file it imported; a version measured from another tree's code is refused.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Tuple

from .versus import Runs

CHILD = Path(__file__).with_name("versus_child.py")


class VersionError(RuntimeError):
    """A child imported another tree's package, or stopped answering."""


class Version:
    def __init__(self, name: str, label: str, root: Path, scenario: str, metrics_profile: str):
        self.name, self.label, self.root = name, label, root.resolve()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(self.root), str(self.root / "scripts")]),
                   GRPC_VERBOSITY="NONE")
        # -P: the child's own directory, in the tree the bench runs from, stays off its search path.
        self.process = subprocess.Popen([sys.executable, "-P", str(CHILD), scenario, metrics_profile], cwd=self.root,
                                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.runs = Runs()
        try:
            self.module, self.floor_series = self._handshake()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Version":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()

    def run(self, rounds: int) -> Runs:
        """`rounds` more rounds; the version keeps them all too."""
        self.process.stdin.write(f"run {rounds}\n")
        self.process.stdin.flush()
        turn = Runs(**self._reply())
        self.runs.extend(turn)
        return turn

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # end of its commands: it stops the check and exits
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _handshake(self) -> Tuple[Path, int]:
        """The file the child imported gpu_monitoring from, and the floor's series."""
        ready = self._reply()
        module = Path(ready["gpu_monitoring"]).resolve()
        if not module.is_relative_to(self.root):
            raise VersionError(f"{self.name}: gpu_monitoring was imported from {module}, not from {self.root}")
        return module, ready["floor_series"]

    def _reply(self) -> Dict[str, Any]:
        line = self.process.stdout.readline()
        if not line:
            raise VersionError(f"{self.name}: the child exited ({self.process.wait()}); its stderr says why")
        return json.loads(line)
