"""How many input sets a template's timed calls cycle through (its optional `timed_inputs`).

A model never computes on the same batch twice: each call gathers other embedding rows and reads activations the
previous kernel just wrote, most of them from memory once they outgrow the last-level cache. A timing loop that
repeats one call finds its data in cache and ranks configs by a speed the model never sees (the tuner's runners
cycle through the sets a template's `timed_inputs` returns: autotune/runtime.py, `input_sets`).
"""

from __future__ import annotations

from typing import Any, Sequence

CACHE_MULTIPLE = 4  # one cycle's calls touch this many times the measuring CPU's largest cache
MAX_TIMED_SETS = 64
# at most this many bytes of new tensors over all sets: a (2048 x 3456) float32 activation is 28 MB, and a
# server's last-level cache (the figure sysfs gives, shared by every core) can reach hundreds of MB
MAX_TIMED_BYTES = 1 << 30


def timed_set_count(touched_bytes: float, cache_bytes: int, new_bytes: float = 0) -> int:
    """Sets to cycle through so that a set's data are evicted before it comes round again: each call touches
    `touched_bytes` (what its kernel reads and writes), each set after the first allocates `new_bytes`."""
    if touched_bytes <= 0 or cache_bytes <= 0:
        return 1
    count = min(MAX_TIMED_SETS, max(1, -(-CACHE_MULTIPLE * cache_bytes // touched_bytes)))
    if new_bytes > 0:
        count = min(count, max(1, int(MAX_TIMED_BYTES // new_bytes)))
    return int(count)


def fresh_activations(tensors: tuple[Any, ...], fresh: Sequence[int], touched_bytes: float, cache_bytes: int,
                      seed: int) -> tuple[tuple[Any, ...], ...]:
    """`tensors`, then sets in which the float tensors at positions `fresh` (activations a model writes anew
    for every batch) are new standard-normal draws of the same shape, the other tensors (weights) shared: a
    `timed_inputs` for operators whose activations outgrow the cache."""
    import torch

    new_bytes = sum(tensors[i].numel() * tensors[i].element_size() for i in fresh)
    count = timed_set_count(touched_bytes, cache_bytes, new_bytes)
    g = torch.Generator().manual_seed(seed + 1_000_003)

    def drawn(i: int, t: Any) -> Any:
        return torch.randn(t.shape, generator=g, dtype=t.dtype) if i in fresh else t

    return (tuple(tensors),) + tuple(tuple(drawn(i, t) for i, t in enumerate(tensors)) for _ in range(count - 1))
