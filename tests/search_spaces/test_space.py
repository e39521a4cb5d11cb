import json
import random

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


def test_duplicate_knob_names_are_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        Space([VEC, Choice("vec", (1, 2))])
