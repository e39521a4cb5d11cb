"""The input sets timed calls cycle through (search_spaces/_timed_inputs.py): enough to leave the cache, bounded
in count and memory; fresh activations beside shared weights."""

import torch

from search_spaces import _timed_inputs as timed


def test_sets_cycle_until_they_outgrow_the_cache_within_the_count_and_memory_caps():
    assert timed.timed_set_count(1 << 20, 0) == 1 and timed.timed_set_count(0, 1 << 20) == 1
    assert timed.timed_set_count(1 << 20, 8 << 20) == timed.CACHE_MULTIPLE * 8
    assert timed.timed_set_count(1 << 10, 1 << 30) == timed.MAX_TIMED_SETS
    # DLRMv2's cross layer on a server's 480 MB cache: 56 MB of new activations a set, about 1 GB in all
    sets = timed.timed_set_count(87 << 20, 480 << 20, new_bytes=56 << 20)
    assert sets == timed.MAX_TIMED_BYTES // (56 << 20) and sets * (56 << 20) <= timed.MAX_TIMED_BYTES
    assert timed.timed_set_count(87 << 20, 480 << 20, new_bytes=2 * timed.MAX_TIMED_BYTES) == 1


def test_fresh_activations_draw_new_activations_and_share_the_rest():
    a, weight, x = torch.ones(4, 8), torch.full((8, 8), 2.0), torch.zeros(4, 8)
    sets = timed.fresh_activations((a, weight, x), (0, 2), touched_bytes=1 << 10, cache_bytes=1 << 12, seed=0)
    assert len(sets) == timed.CACHE_MULTIPLE * 4 and sets[0][0] is a and sets[0][2] is x
    for s in sets[1:]:
        assert s[1] is weight
        assert s[0].shape == a.shape and s[0].dtype == a.dtype and not torch.equal(s[0], a)
        assert s[2].shape == x.shape and not torch.equal(s[2], x)
    assert not torch.equal(sets[1][0], sets[2][0])  # each set its own draw
