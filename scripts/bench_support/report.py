"""The figures of one bench run as sections of tables, printed as text and written as Markdown."""

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Sequence

# The node whose figures the README quotes.
HEADLINE_SCENARIO = "dgx-h100"


@dataclass
class Table:
    title: str
    headers: List[str]
    rows: List[List[Any]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


@dataclass
class Section:
    title: str
    tables: List[Table] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


@dataclass
class Target:
    """One figure judged against its target: the script says PASS or FAIL, tests never do."""

    name: str
    figure: float
    limit: str
    ok: bool

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "FAIL"


@dataclass
class Report:
    sections: List[Section] = field(default_factory=list)
    targets: List[Target] = field(default_factory=list)
    # Series for the plot: panel -> {"x": [...], "total": [...], "own": [...]}.
    curves: Dict[str, Dict[str, List[float]]] = field(default_factory=dict)
    # The figures the README quotes, by name: docs/performance.json keeps them for its block.
    headline: Dict[str, float] = field(default_factory=dict)

    def quote(self, name: str, figure: float) -> float:
        """Keep a figure the docs quote in prose under `name` in docs/performance.json, and return it."""
        self.headline[name] = figure
        return figure

    def target(self, name: str, figure: float, limit: str, ok: bool) -> str:
        """Record a target and return its verdict, for the table row that shows the figure."""
        judged = Target(name, figure, limit, ok)
        self.targets.append(judged)
        return judged.verdict

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def fmt(value: Any) -> str:
    """Numbers with as many digits as they deserve: counts whole, small figures with decimals."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.1 or magnitude == 0:
        return f"{value:.2f}"
    return f"{value:.3g}"


def text(section: Section) -> str:
    lines = [f"== {section.title} =="]
    for table in section.tables:
        lines += ["", f"-- {table.title}", *_aligned(table.headers, table.rows)]
        lines += [f"   {note}" for note in table.notes]
    lines += [f"  {note}" for note in section.notes]
    return "\n".join(lines) + "\n"


def markdown(section: Section) -> str:
    lines = [f"## {section.title}", ""]
    for table in section.tables:
        lines += [f"**{table.title}**", ""]
        lines.append("| " + " | ".join(table.headers) + " |")
        lines.append("|" + "|".join("---" if i == 0 else "--:" for i in range(len(table.headers))) + "|")
        lines += ["| " + " | ".join(fmt(cell).replace("|", "\\|") for cell in row) + " |" for row in table.rows]
        lines += [""] + [f"{note}  " for note in table.notes] + ([""] if table.notes else [])
    lines += [f"{note}  " for note in section.notes]
    return "\n".join(lines).rstrip() + "\n"


def _aligned(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> List[str]:
    cells = [list(headers)] + [[fmt(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        # The first column names the row (left); the others are figures (right).
        return "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return [line(cells[0])] + [line(row) for row in cells[1:]]
