import random

import numpy as np

from autotune.search import annealing_search, model_search, random_search
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


def test_model_search_scores_the_whole_space_when_given_it_and_keeps_epsilon_random():
    sp = space()

    def score(cfgs):
        return np.array([-abs(c[A][0] - 8) - abs(c[B] - 8) for c in cfgs], dtype=float)

    got = model_search(sp, set(), 10, random.Random(0), score, candidates=list(sp), epsilon=0.1)
    assert len(set(got)) == 10
    ranked = sorted(sp, key=lambda c: -score([c])[0])
    assert got[:9] == ranked[:9]  # exhaustive: exactly the nine best-scored configs, best first
    # seen configs are never proposed again
    again = model_search(sp, set(got), 10, random.Random(0), score, candidates=list(sp), epsilon=0.0)
    assert again == [c for c in ranked if c not in set(got)][:10]


def test_model_search_reranks_a_shortlist_with_the_second_scorer():
    sp = space()
    first = lambda cfgs: np.array([float(c[B]) for c in cfgs])  # noqa: E731  (prefers large b)
    second = lambda cfgs: np.array([-float(c[A][0]) for c in cfgs])  # noqa: E731  (prefers small a[0])
    got = model_search(sp, set(), 2, random.Random(0), first, candidates=list(sp), rerank=second,
                       epsilon=0.0, pool=3)  # a shortlist of 6: all b=8 (7 configs have it)
    assert all(c[B] == 8 for c in got)  # from the shortlist of the first scorer ...
    assert [c[A][0] for c in got] == [1, 2]  # ... the two the second prefers


def test_model_search_without_a_model_starts_with_the_default_then_spreads_out():
    sp = space()
    got = model_search(sp, set(), 6, random.Random(0), None)
    assert got[0] == sp.default() and len(set(got)) == 6


def test_model_search_rejects_bad_options():
    import pytest

    with pytest.raises(ValueError, match="epsilon"):
        model_search(space(), set(), 4, random.Random(0), lambda c: np.zeros(len(c)), epsilon=2.0)
    with pytest.raises(ValueError, match="pool"):
        model_search(space(), set(), 4, random.Random(0), lambda c: np.zeros(len(c)), pool=0)
