import random

import numpy as np

from autotune.search import annealing_search, diverse_pick, model_search, random_search
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


def test_random_search_can_start_with_the_default_like_the_model_does():
    import pytest

    sp = space()
    first = random_search(sp, set(), 4, random.Random(0), default_first=True)
    assert first[0] == sp.default() and len(set(first)) == 4
    later = random_search(sp, set(first), 4, random.Random(0), default_first=True)  # measured: not again
    assert sp.default() not in later and len(later) == 4
    assert sp.default() not in random_search(sp, {sp.default()}, 3, random.Random(1), default_first=True)
    with pytest.raises(ValueError, match="default_first must be true or false"):
        random_search(sp, set(), 4, random.Random(0), default_first="yes")


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

    got = model_search(sp, set(), 10, random.Random(0), score, candidates=list(sp), epsilon=0.1, diversity=1)
    assert len(set(got)) == 10
    ranked = sorted(sp, key=lambda c: -score([c])[0])
    assert got[:9] == ranked[:9]  # exhaustive: exactly the nine best-scored configs, best first
    # seen configs are never proposed again
    again = model_search(sp, set(got), 10, random.Random(0), score, candidates=list(sp), epsilon=0.0, diversity=1)
    assert again == [c for c in ranked if c not in set(got)][:10]


def test_model_search_reranks_a_shortlist_with_the_second_scorer():
    sp = space()
    first = lambda cfgs: np.array([float(c[B]) for c in cfgs])  # noqa: E731  (prefers large b)
    second = lambda cfgs: np.array([-float(c[A][0]) for c in cfgs])  # noqa: E731  (prefers small a[0])
    got = model_search(sp, set(), 2, random.Random(0), first, candidates=list(sp), rerank=second,
                       epsilon=0.0, pool=3, diversity=1)  # a shortlist of 6: all b=8 (7 configs have it)
    assert all(c[B] == 8 for c in got)  # from the shortlist of the first scorer ...
    assert [c[A][0] for c in got] == [1, 2]  # ... the two the second prefers


def test_model_search_without_a_model_starts_with_the_default_then_spreads_out():
    sp = space()
    got = model_search(sp, set(), 6, random.Random(0), None)
    assert got[0] == sp.default() and len(set(got)) == 6
    assert got == model_search(sp, set(), 6, random.Random(0), None, design="coverage")  # the default design


def test_model_search_without_a_model_can_spread_by_coverage():
    sp = space()
    got = model_search(sp, set(), 4, random.Random(0), None, design="coverage")
    assert got[0] == sp.default() and {c[B] for c in got} == {1, 2, 4, 8}


def test_model_search_rejects_bad_options():
    import pytest

    with pytest.raises(ValueError, match="epsilon"):
        model_search(space(), set(), 4, random.Random(0), lambda c: np.zeros(len(c)), epsilon=2.0)
    with pytest.raises(ValueError, match="pool"):
        model_search(space(), set(), 4, random.Random(0), lambda c: np.zeros(len(c)), pool=0)
    with pytest.raises(ValueError, match="design must be one of distance, coverage"):
        model_search(space(), set(), 4, random.Random(0), None, design="cover")
    with pytest.raises(ValueError, match="diversity"):  # on the first, cold call, not only once a model exists
        model_search(space(), set(), 4, random.Random(0), None, diversity=0.5)
    with pytest.raises(ValueError, match="diversity must be a number >= 1, got 'abc'"):  # a contender's typo
        model_search(space(), set(), 4, random.Random(0), None, diversity="abc")
    with pytest.raises(ValueError, match="epsilon must be a number in"):
        model_search(space(), set(), 4, random.Random(0), None, epsilon="lots")


def test_diverse_pick_follows_the_ranking_but_skips_near_copies():
    sp = space()
    ranked = sorted(sp, key=lambda c: (-c[B], c[A]))  # the four best share b=8; then b=4 ...
    got = diverse_pick(ranked, 4)
    assert got[0] == ranked[0] and len(set(got)) == 4
    assert {c[B] for c in got} == {1, 2, 4, 8}  # four guesses apart, not four variants of b=8
    assert len({c[A] for c in got}) == 4
    assert diverse_pick(ranked[:3], 5) == ranked[:3]  # fewer than asked: all of them
    assert diverse_pick(ranked[:9], 3) == [ranked[0], ranked[8], ranked[1]]  # short of apart ones: best skipped


def test_model_search_with_diversity_hedges_within_the_models_best():
    sp = space()

    def score(cfgs):  # prefers b=8 above all, then small a[0]
        return np.array([10.0 * c[B] - c[A][0] for c in cfgs])

    plain = model_search(sp, set(), 4, random.Random(0), score, candidates=list(sp), epsilon=0.0, diversity=1)
    hedged = model_search(sp, set(), 4, random.Random(0), score, candidates=list(sp), epsilon=0.0)  # 3: default
    assert {c[B] for c in plain} == {8} and plain[0] == hedged[0]
    top12 = sorted(sp, key=lambda c: -score([c])[0])[:12]
    assert set(hedged) <= set(top12) and {c[B] for c in hedged} == {4, 8}


def test_asking_for_no_random_configs_never_enumerates_the_space():
    """model_search and spread_design top up with random configs; where nothing is left to top up, the space
    (a fused embedding space: millions of combinations) is not enumerated."""
    from autotune.search import _random_unseen

    class Unenumerable(Space):
        def __iter__(self):
            raise AssertionError("enumerated")

    space = Unenumerable([Choice("a", (1, 2, 3))])
    assert _random_unseen(space, set(), 0, random.Random(0)) == []
    assert len(_random_unseen(space, set(), 2, random.Random(0))) == 2
