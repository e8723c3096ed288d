"""Text lines fitted to the terminal: a line wider than it goes on below, indented to where its free
text (a message, a list of holders) begins, so that the columns to its left stay readable."""

import shutil
import textwrap
from typing import List, Optional

# The width where standard output is no terminal (a pipe, a file) and COLUMNS does not say.
DEFAULT_WIDTH = 100
# A hanging indent never leaves less room than this for the text it indents.
LEAST_ROOM = 30


def terminal_width() -> int:
    """COLUMNS, else the terminal's width, else DEFAULT_WIDTH (shutil.get_terminal_size's order)."""
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def fit(line: str, width: Optional[int], indent: int) -> List[str]:
    """`line` in lines of at most `width` columns, broken between words (a longer word stays whole), the
    lines after the first indented by `indent` spaces; as it is without a width (JSON, a test)."""
    if width is None or len(line) <= width:
        return [line]
    hanging = " " * max(0, min(indent, width - LEAST_ROOM))
    return textwrap.wrap(line, width, subsequent_indent=hanging, break_long_words=False, break_on_hyphens=False)
