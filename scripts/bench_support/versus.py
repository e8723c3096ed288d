"""Two versions of the check against the submission floor, from turns of interleaved rounds.

The versions take turns base, head, head, base, base, head, … so neither always runs first. Each
version's figure is `floor.FloorComparison`'s over all its rounds; the pairwise figure compares
each head turn with the base turn beside it, which leaves out a drift slower than two turns (a
neighbour's load on a shared machine) that the overall medians take in.
"""

import statistics
from dataclasses import dataclass, field
from typing import Iterator, List, Sequence, Tuple

from .floor import FloorComparison
from .harness import median_ms

BASE, HEAD = "base", "head"


@dataclass
class Runs:
    """Per-run figures of a number of rounds, in seconds, as a child reports them."""

    cpu: List[float] = field(default_factory=list)
    own: List[float] = field(default_factory=list)
    own_and_entry: List[float] = field(default_factory=list)
    floor: List[float] = field(default_factory=list)
    series: List[int] = field(default_factory=list)

    def extend(self, more: "Runs") -> None:
        for name in ("cpu", "own", "own_and_entry", "floor", "series"):
            getattr(self, name).extend(getattr(more, name))

    def comparison(self, floor_series: int) -> FloorComparison:
        """What `floor.compare` would give for these rounds."""
        return FloorComparison(
            cpu_ms=median_ms(self.cpu),
            own_ms=median_ms(self.own),
            own_and_entry_ms=median_ms(self.own_and_entry),
            floor_ms=median_ms(self.floor),
            series=self.series[-1],
            floor_series=floor_series,
            rounds=len(self.own),
        )


def turns(rounds: int, batch: int) -> Iterator[Tuple[str, int]]:
    """(version, rounds) in the order they run, until each has run `rounds` rounds."""
    done = 0
    pair = 0
    while done < rounds:
        size = min(batch, rounds - done)
        for version in ((BASE, HEAD) if pair % 2 == 0 else (HEAD, BASE)):
            yield version, size
        done += size
        pair += 1


def difference_percent(head: float, base: float) -> float:
    return (head / base - 1) * 100


def pairwise_percent(pairs: Sequence[Tuple[float, float]]) -> float:
    """The median over (head, base) pairs of turns of head over base, as a difference in percent."""
    return difference_percent(statistics.median(head / base for head, base in pairs), 1)


def verdict(percent: float, limit: float) -> str:
    return "PASS" if percent <= limit else "FAIL"
