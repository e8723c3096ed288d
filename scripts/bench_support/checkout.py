"""A git revision checked out into a temporary worktree for as long as a `with` block runs."""

import contextlib
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def checked_out(repository: Path, revision: str) -> Iterator[Path]:
    """The worktree's root; it is removed, and git told so, however the block ends."""
    directory = Path(tempfile.mkdtemp(prefix="bench-versus-"))
    root = directory / "tree"
    try:
        _git(repository, "worktree", "add", "--quiet", "--detach", str(root), revision)
        yield root
    finally:
        _git(repository, "worktree", "remove", "--force", str(root), check=False)
        shutil.rmtree(directory, ignore_errors=True)
        _git(repository, "worktree", "prune", check=False)


def commit_of(repository: Path, revision: str) -> str:
    return _git(repository, "rev-parse", "--short", f"{revision}^{{commit}}").strip()


def _git(repository: Path, *args: str, check: bool = True) -> str:
    """git's output; its complaints reach stderr where a failure would stop the bench."""
    return subprocess.run(["git", "-C", str(repository), *args], check=check, stdout=subprocess.PIPE,
                          stderr=None if check else subprocess.DEVNULL, text=True).stdout
