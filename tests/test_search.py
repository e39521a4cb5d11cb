import random

import numpy as np

from autotune.search import annealing_search, random_search
from search_spaces import Choice, Space, Split

A = Split("a", parts=2).over(64)
B = Choice("b", (1, 2, 4, 8))


def space():
    return Space([A, B])


def test_random_search_gives_distinct_unseen_configs():
    sp = space()
    rng = random.Random(0)
    seen = {sp.sample(rng) for _ in range(10)}
    got = random_search(sp, seen, 20, rng)
    assert len(got) == 20 and len(set(got)) == 20 and not set(got) & seen


def test_search_stops_at_exhaustion():
    sp = space()
    rng = random.Random(0)
    seen = set(list(sp)[:-3])
    assert set(random_search(sp, seen, 10, rng)) == set(list(sp)[-3:])
    assert random_search(sp, set(sp), 10, rng) == []


def test_annealing_follows_the_score_and_keeps_an_epsilon_of_random():
    sp = space()
    rng = random.Random(0)

    def score(cfgs):  # best is a=(8, 8), b=8
        return np.array([-abs(c[A][0] - 8) - abs(c[B] - 8) for c in cfgs], dtype=float)

    got = annealing_search(sp, set(), 10, rng, score, epsilon=0.1)
    assert len(got) == 10 and len(set(got)) == 10
    assert got[0][A] == (8, 8) and got[0][B] == 8
    top = score(got[:9])
    assert top.mean() > score([sp.sample(rng) for _ in range(200)]).mean() + 2


def test_annealing_without_a_model_is_random():
    sp = space()
    got = annealing_search(sp, set(), 5, random.Random(0), None)
    assert len(set(got)) == 5
