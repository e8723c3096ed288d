"""Two measurements taken round by round, each round in the other order than the last, so a drift
between them (caches, CPU frequency, a neighbour's load) falls on both alike.

It imports nothing of the bench's: a child of `bench_versus.py` that measures another version of
the code loads this file by path, as that version's own bench_support may not have it.
"""

from typing import Callable, List, Tuple, TypeVar

A = TypeVar("A")
B = TypeVar("B")


def interleave(rounds: int, first: Callable[[], A], second: Callable[[], B],
               start: int = 0) -> Tuple[List[A], List[B]]:
    """`rounds` rounds of both; an even round (counted from `start`, so that batches of rounds
    continue one alternation) runs `second` before `first`."""
    firsts: List[A] = []
    seconds: List[B] = []
    for i in range(start, start + rounds):
        if i % 2:
            firsts.append(first())
        seconds.append(second())
        if not i % 2:
            firsts.append(first())
    return firsts, seconds
