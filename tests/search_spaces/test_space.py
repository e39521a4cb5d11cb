import json
import random

import numpy as np
import pytest

from search_spaces import Choice, Config, Constraint, InvalidConfig, Space, Split

TILE = Split("tile", parts=3, pow2=True)
VEC = Choice("vec", (8, 4, 16), doc="lanes")
ORDER = Choice("order", ("a", "b"))


def make_space():
    return Space([TILE.over(16), VEC, ORDER], [Constraint("b needs vec 8", lambda c: c[ORDER] == "a" or c[VEC] == 8)])


def test_split_enumerates_all_factorisations():
    vals = Split("s", parts=2).over(12).values
    assert set(vals) == {(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)}
    assert all(a * b == 12 for a, b in vals)
    p2 = Split("s", parts=3, pow2=True).over(8).values
    assert all(x & (x - 1) == 0 for v in p2 for x in v) and (2, 2, 2) in p2 and len(p2) == 10


def test_split_pow2_skips_non_power_factors():
    assert Split("s", parts=2, pow2=True).over(12).values == ()
    assert Split("s", parts=2, pow2=True).over(8).values == ((1, 8), (2, 4), (4, 2), (8, 1))


def test_unbound_split_is_an_error():
    with pytest.raises(ValueError, match="not bound"):
        Split("s", parts=2).values


def test_space_size_respects_constraints():
    sp = make_space()
    tiles = len(TILE.over(16).values)
    assert tiles == 15  # exponents of three powers of two summing to 4: C(6, 2)
    assert sp.raw_size == tiles * 3 * 2
    assert len(sp) == tiles * 3 + tiles * 1
    assert all(sp.is_valid(c) for c in sp)


def test_size_up_to_stops_counting_at_its_limit_and_len_counts_once():
    """A fused embedding space has millions of combinations: whether it holds a run's trials is answered from
    its first valid configs, and its full size is enumerated once per space."""
    checked = []

    def even(c: Config) -> bool:
        checked.append(c)
        return c[A] % 2 == 0

    A, B = Choice("a", tuple(range(100))), Choice("b", tuple(range(100)))
    space = Space([A, B], [Constraint("a even", even)])
    assert space.size_up_to(8) == 8 and len(checked) <= 16  # the first 8 valid of 10,000 combinations
    assert len(space) == 5000 and len(checked) > 10_000 - 100
    checked.clear()
    assert len(space) == 5000 and space.size_up_to(10**9) == 5000 and space.size_up_to(3) == 3 and not checked
    assert Space([A], [Constraint("none", lambda c: False)]).size_up_to(8) == 0


def test_config_is_hashable_and_round_trips_through_json():
    sp = make_space()
    cfg = sp.sample(random.Random(1))
    again = sp.from_json(json.loads(json.dumps(cfg.to_json())))
    assert again == cfg and hash(again) == hash(cfg) and again.key() == cfg.key()
    assert isinstance(cfg[TILE], tuple) and cfg[VEC] in (4, 8, 16)


def test_lookup_by_knob_object_and_missing_knob():
    sp = make_space()
    cfg = sp.default()
    assert cfg[VEC] == 8 and cfg[ORDER] == "a"
    with pytest.raises(KeyError, match="no knob 'other'"):
        cfg[Choice("other", (1,))]


def test_make_rejects_bad_values_unknown_knobs_and_constraint_violations():
    sp = make_space()
    with pytest.raises(InvalidConfig, match="not in its domain"):
        sp.make({"tile": [3, 3, 2], "vec": 8, "order": "a"})
    with pytest.raises(InvalidConfig, match="unknown"):
        sp.make({"tile": [1, 1, 16], "vec": 8, "order": "a", "x": 1})
    with pytest.raises(InvalidConfig, match="b needs vec 8"):
        sp.make({"tile": [1, 1, 16], "vec": 4, "order": "b"})


def test_sampling_and_neighbours_stay_valid_and_move_one_knob():
    sp = make_space()
    rng = random.Random(0)
    seen = {sp.sample(rng) for _ in range(300)}
    assert all(sp.is_valid(c) for c in seen) and len(seen) > 20
    for cfg in list(seen)[:50]:
        nb = sp.neighbour(cfg, rng)
        assert sp.is_valid(nb) and nb != cfg
        assert sum(a != b for a, b in zip(cfg.items, nb.items)) == 1


def test_encode_gives_fixed_width_numeric_features():
    sp = make_space()
    names = sp.feature_names()
    assert names == ["tile.0", "tile.1", "tile.2", "vec", "order"]
    rows = [sp.encode(c) for c in sp]
    assert {len(r) for r in rows} == {len(names)}


def test_choice_only_restricts_in_declaration_order():
    assert VEC.only([16, 8]).options == (8, 16)
    with pytest.raises(ValueError):
        VEC.only([3])


def test_choice_leading_puts_one_option_first_and_keeps_the_rest_in_order():
    assert VEC.leading(VEC.options[-1]).options == (VEC.options[-1],) + VEC.options[:-1]
    assert VEC.leading(VEC.options[0]) == VEC
    with pytest.raises(ValueError, match="not an option"):
        VEC.leading(3)


def test_duplicate_knob_names_are_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        Space([VEC, Choice("vec", (1, 2))])


# ---- code paths: sampling per path ---------------------------------------------------------------------
PATH = Choice("path", ("big", "mid", "small", "never"))
X = Choice("x", tuple(range(20)))
Y = Choice("y", (1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
PATH_SIZES = {"big": 200, "mid": 50, "small": 1, "never": 0}


def path_space(**kw):
    """Paths of 200, 50, 1 and 0 valid configs (of 200 raw each): uniform sampling would hardly see 'small'."""
    def fits(c):
        return {"big": True, "mid": c[X] < 5, "small": c[X] == 0 and c[Y] == 1, "never": False}[c[PATH]]

    return Space([PATH, X, Y], [Constraint("paths differ in size", fits)], **kw)


def test_paths_present_and_path_of():
    sp = path_space(paths=["path"])
    assert sp.paths == ("path",)
    assert sp.paths_present() == (("big",), ("mid",), ("small",))  # 'never' has no valid config
    assert all(sp.path_of(c) == (c[PATH],) for c in sp)
    assert make_space().paths == () and make_space().paths_present() == ((),)
    assert make_space().path_of(make_space().default()) == ()


def test_sampling_visits_every_present_path_about_equally_and_stays_valid():
    sp = path_space(paths=["path"])
    rng = random.Random(0)
    samples = [sp.sample(rng) for _ in range(3000)]
    counts = {p: sum(c[PATH] == p for c in samples) for p in PATH_SIZES}
    assert counts["never"] == 0 and all(sp.is_valid(c) for c in samples)
    for p in ("big", "mid", "small"):
        assert 900 <= counts[p] <= 1100, counts  # 1000 each expected; uniform sampling gives 'small' ~12
    mid = [c for c in samples if c[PATH] == "mid"]
    assert len(set(mid)) == PATH_SIZES["mid"]  # uniform within a path: ~1000 draws of 50 configs hit them all


def test_sampling_a_given_path_stays_on_it():
    A, B = Choice("a", ("x", "y")), Choice("b", tuple(range(10)))
    space = Space([A, B], [Constraint("y only with b < 2", lambda c: c[A] == "x" or c[B] < 2)], paths=["a"])
    rng = random.Random(0)
    drawn = {space.sample(rng, path=("y",)) for _ in range(50)}
    assert {space.path_of(c) for c in drawn} == {("y",)} and len(drawn) == 2
    with pytest.raises(ValueError, match="a path names 1 values"):
        space.sample(rng, path=("y", 1))


def test_sampling_falls_back_to_the_enumerated_path_when_rejection_fails():
    sp = path_space(paths=["path"])
    rng = random.Random(1)
    samples = [sp.sample(rng, tries=1) for _ in range(600)]  # one draw: 'small' is found by enumeration
    assert all(sp.is_valid(c) for c in samples)
    assert {c[PATH] for c in samples} == {"big", "mid", "small"}
    assert sum(c[PATH] == "small" for c in samples) > 150


def _sample_before_paths(sp, rng, tries=1000):
    """Space.sample as it was before code paths: rejection over the knob product, then the enumerated space."""
    for _ in range(tries):
        cfg = Config(tuple((k.name, rng.choice(k.values)) for k in sp.knobs))
        if sp.is_valid(cfg):
            return cfg
    return rng.choice(list(sp))


@pytest.mark.parametrize("tries", [1000, 1])
def test_sampling_without_paths_draws_the_same_sequence_as_before(tries):
    for sp in (make_space(), path_space()):
        new, old = random.Random(5), random.Random(5)
        assert [sp.sample(new, tries) for _ in range(200)] == [_sample_before_paths(sp, old, tries) for _ in range(200)]
    uniform, rng = path_space(), random.Random(2)  # without paths the shares stay: 'small' is 1 config in 251
    assert sum(uniform.sample(rng)[PATH] == "small" for _ in range(1000)) < 20


def test_bad_path_declarations_are_clear_errors():
    with pytest.raises(ValueError, match="unknown path knob.*'nope'"):
        path_space(paths=["nope"])
    with pytest.raises(ValueError, match="named twice"):
        path_space(paths=["path", "path"])
    with pytest.raises(ValueError, match="lacks the path knobs"):
        path_space(paths=["path"]).path_of(make_space().default())


# ---- spread: the first batch without a model ---------------------------------------------------------
A = Choice("a", (1, 2, 4, 8, 16, 32, 64, 128))
B = Choice("b", ("p", "q", "r", "s", "t", "u"))
C = Split("c", parts=2, pow2=True)


def wide_space(**kw):
    return Space([A, B, C.over(64), PATH], [Constraint("a*c0 bounded", lambda c: c[A] * c[C][0] <= 512),
                                            Constraint("never is never", lambda c: c[PATH] != "never"),
                                            Constraint("small is small", lambda c: c[PATH] != "small" or c[A] == 1)],
                 **kw)


def _unit(sp, configs):
    """Encodings scaled per column to [0, 1] over the whole enumerated space (computed here, independently)."""
    every = np.array([sp.encode(c) for c in sp], dtype=float)
    low, span = every.min(axis=0), np.ptp(every, axis=0)
    return (np.array([sp.encode(c) for c in configs], dtype=float) - low) / np.where(span > 0, span, 1)


def _min_distance(sp, configs):
    pts = _unit(sp, configs)
    d = np.sqrt(((pts[:, None, :] - pts[None, :, :]) ** 2).sum(axis=2))
    return d[np.triu_indices(len(configs), 1)].min()


def test_spread_gives_distinct_valid_configs_starting_with_first_and_covering_paths():
    sp = wide_space(paths=["path"])
    first = [sp.default()]
    out = sp.spread(12, random.Random(0), first=first)
    assert len(out) == 12 and len(set(out)) == 12 and out[0] == first[0]
    assert all(c in sp for c in out)
    assert {sp.path_of(c) for c in out[:3]} == set(sp.paths_present())  # every path before any repeats
    assert sp.spread(12, random.Random(0), first=first) == out  # deterministic for a seed
    assert sp.spread(12, random.Random(1), first=first) != out
    assert sp.spread(0, random.Random(0)) == [] and sp.spread(1, random.Random(0), first=first) == first


def test_spread_is_farther_apart_than_random_samples():
    sp = wide_space(paths=["path"])
    spread, rand = [], []
    for seed in range(5):
        rng = random.Random(seed)
        spread.append(_min_distance(sp, sp.spread(10, rng)))
        rand.append(_min_distance(sp, list(dict.fromkeys(sp.sample(rng) for _ in range(10)))))
    assert np.mean(spread) > 1.5 * np.mean(rand), (spread, rand)
    assert min(spread) > max(rand) * 0.9


def test_coverage_spread_tries_each_knob_value_evenly_and_stays_typical():
    """criterion="coverage": every value of each small knob within a few picks and none twice before the
    others once; not drawn to the corners of the space as the distance criterion is."""
    sp = wide_space(paths=["path"])
    knob_b = {c[B] for c in sp}
    for seed in range(5):
        out = sp.spread(8, random.Random(seed), first=[sp.default()], criterion="coverage")
        assert len(set(out)) == 8 and all(c in sp for c in out) and out[0] == sp.default()
        assert {sp.path_of(c) for c in out[:3]} == set(sp.paths_present())
        firsts = [c[B] for c in out[: len(knob_b)]]
        assert sorted(firsts, key=str) == sorted(knob_b, key=str), firsts  # each value once, before repeats
    corner = [sum(abs(x - 0.5) for x in row) for row in _unit(sp, [c for c in sp])]
    typical = float(np.mean(corner))
    far = lambda crit: np.mean([np.mean([sum(abs(x - 0.5) for x in row)  # noqa: E731
                                         for row in _unit(sp, sp.spread(8, random.Random(s), criterion=crit))])
                                for s in range(5)])
    assert far("coverage") < far("distance") and far("coverage") < 1.2 * typical
    with pytest.raises(ValueError, match="criterion"):
        sp.spread(3, random.Random(0), criterion="corners")


def test_spread_takes_the_whole_of_a_small_space_and_refuses_more():
    sp = make_space()
    every = sp.spread(len(sp), random.Random(0))
    assert set(every) == set(sp)
    with pytest.raises(ValueError, match=f"only {len(sp)} valid configs"):
        sp.spread(len(sp) + 1, random.Random(0))


def test_spread_rejects_bad_first_configs_and_n():
    sp = make_space()
    with pytest.raises(ValueError, match="n must be >= 0"):
        sp.spread(-1, random.Random(0))
    with pytest.raises(ValueError, match="2 first configs given for n=1"):
        sp.spread(1, random.Random(0), first=list(sp)[:2])
    with pytest.raises(ValueError, match="repeat"):
        sp.spread(3, random.Random(0), first=[sp.default(), sp.default()])
    foreign = Config((("tile", (1, 1, 16)), ("vec", 4), ("order", "b")))  # violates "b needs vec 8"
    with pytest.raises(ValueError, match="not in this space"):
        sp.spread(3, random.Random(0), first=[foreign])
