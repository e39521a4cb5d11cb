"""Search strategies: each is one function that proposes the next batch of unmeasured configs.

`random_search` is the baseline. `annealing_search` runs simulated annealing on cost-model scores (AutoTVM's
SA optimiser): a population walks the space by neighbour moves, accepting worse points with a temperature
that cools, and the best-scored unseen configs are proposed, plus an epsilon share of random picks so a
wrong model cannot trap the search.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Callable, Sequence

import numpy as np

from search_spaces import Config, Space

Scorer = Callable[[Sequence[Config]], np.ndarray]  # higher = predicted faster


def _random_unseen(space: Space, seen: set[Config], n: int, rng: random.Random) -> list[Config]:
    out: list[Config] = []
    picked = set(seen)
    for _ in range(n * 50):
        if len(out) == n:
            return out
        cfg = space.sample(rng)
        if cfg not in picked:
            picked.add(cfg)
            out.append(cfg)
    # sampling keeps hitting seen configs: the space is nearly exhausted, so enumerate what is left
    rest = [c for c in space if c not in picked]
    rng.shuffle(rest)
    return out + rest[: n - len(out)]


def random_search(space: Space, seen: set[Config], n: int, rng: random.Random,
                  score: Scorer | None = None, elites: Sequence[Config] = ()) -> list[Config]:
    """n distinct unmeasured configs, uniformly at random."""
    return _random_unseen(space, seen, n, rng)


def annealing_search(space: Space, seen: set[Config], n: int, rng: random.Random,
                     score: Scorer | None = None, elites: Sequence[Config] = (),
                     epsilon: float = 0.1, population: int = 64, steps: int = 60,
                     temperature: tuple[float, float] = (1.0, 0.0)) -> list[Config]:
    """n distinct unmeasured configs: the cost model's best found by simulated annealing, plus random."""
    if score is None:
        return _random_unseen(space, seen, n, rng)
    n_random = max(1, int(round(n * epsilon))) if n > 1 else 0
    n_model = n - n_random

    points = list(elites)[: population // 2]
    points += [space.sample(rng) for _ in range(population - len(points))]
    scores = score(points)
    best: list[tuple[float, int, Config]] = []  # min-heap of the n_model best unseen configs by score
    in_best: set[Config] = set()
    tiebreak = 0

    def offer(cfg: Config, s: float) -> None:
        nonlocal tiebreak
        if cfg in seen or cfg in in_best:
            return
        tiebreak += 1
        if len(best) < n_model:
            heapq.heappush(best, (s, tiebreak, cfg))
            in_best.add(cfg)
        elif s > best[0][0]:
            _, _, old = heapq.heapreplace(best, (s, tiebreak, cfg))
            in_best.discard(old)
            in_best.add(cfg)

    for cfg, s in zip(points, scores):
        offer(cfg, float(s))
    t0, t1 = temperature
    spread = float(np.std(scores)) or 1.0
    for step in range(steps):
        t = (t0 + (t1 - t0) * step / max(1, steps - 1)) * spread
        moved = [space.neighbour(p, rng) for p in points]
        new_scores = score(moved)
        for i, (cfg, s) in enumerate(zip(moved, new_scores)):
            offer(cfg, float(s))
            delta = float(s) - float(scores[i])
            if delta >= 0 or (t > 0 and rng.random() < math.exp(delta / t)):
                points[i], scores[i] = cfg, s
    chosen = [cfg for _, _, cfg in sorted(best, reverse=True)]
    return chosen + _random_unseen(space, seen | set(chosen), n - len(chosen), rng)


STRATEGIES: dict[str, Callable[..., list[Config]]] = {
    "xgb": annealing_search,
    "random": random_search,
}
