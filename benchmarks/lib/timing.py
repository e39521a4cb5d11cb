"""Contenders timed in one process, in interleaved rounds: each round times every contender once, in the same
order, so that a slow phase of the machine falls on all of them alike rather than on whichever ran then."""

from __future__ import annotations

from typing import Callable, Mapping, TypeVar

T = TypeVar("T")


def interleaved(fns: Mapping[str, T], rounds: int, time_one: Callable[[T], float]) -> dict[str, list[float]]:
    """`time_one(fn)` for every contender in each of `rounds` rounds; per contender, its figure of each round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_one(fn))
    return times
