"""Sysfs trees for tests, made from recordings of the shell commands that list a real one.

A recording (tests/data/sysfs/*.txt) is a shell transcript, its commands run with `2>&1`: `#` lines are
notes and `$ ` lines the commands; every other line is what a command printed, one of
- `find <paths> -printf '%p -> %l\\n'`: a symbolic link, `/sys/<path> -> <target>`;
- `grep . <files>`: a line of a file, `/sys/<path>:<text>`;
- grep's complaint about a file it could not read, `grep: /sys/<path>: <error>`.

`materialize` makes that tree under a directory, which stands for `/sys`. A link is made with its target
directory, so files recorded through it land where the kernel keeps them. A file grep found missing is
left out; one it could not read ("Invalid argument": the driver refused) becomes a directory, whose
read fails at once with EISDIR. That is how the test makes a read fail even as root, whom chmod 000
does not stop, and without the block a FIFO's open would bring.
"""

import os
import re
from pathlib import Path

RECORDINGS = Path(__file__).parent / "data" / "sysfs"
_LINK = re.compile(r"/sys/(\S+) -> (\S+)")
_UNREADABLE = re.compile(r"grep: /sys/(\S+): (.+)")
# The file's name has no colon, while a PCI address in the path has some; greedy, the path runs to
# the last "/name:" before the text, which in these files holds no "/name:" of its own.
_LINE = re.compile(r"/sys/(\S*/[^/:\s]+):(.*)")


def materialize(recording: str, root: Path) -> Path:
    """The tree `recording` (a file in tests/data/sysfs) lists, made under `root` (made if need be)."""
    root.mkdir(parents=True, exist_ok=True)
    for number, line in enumerate((RECORDINGS / recording).read_text().splitlines(), 1):
        if not line or line.startswith(("#", "$ ")):
            continue
        if not _apply(line, root):
            raise ValueError(f"{recording}:{number}: not a line these commands print: {line!r}")
    return root


def _apply(line: str, root: Path) -> bool:
    link, unreadable, text = _LINK.fullmatch(line), _UNREADABLE.fullmatch(line), _LINE.fullmatch(line)
    if link:
        _link(root / link[1], link[2], root)
    elif unreadable:
        if unreadable[2] != "No such file or directory":
            os.makedirs(root / unreadable[1])
    elif text:
        path = root / text[1]
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(text[2] + "\n")
    return bool(link or unreadable or text)


def _link(path: Path, target: str, root: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)
    resolved = os.path.normpath(os.path.join(os.path.realpath(path.parent), target))
    if os.path.commonpath([resolved, os.path.realpath(root)]) != os.path.realpath(root):
        raise ValueError(f"{path} -> {target} points out of the recorded /sys")
    os.makedirs(resolved, exist_ok=True)
