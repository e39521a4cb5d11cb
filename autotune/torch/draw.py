"""Batches drawn like the example inputs: the held-out batches of the accuracy contract and the fresh batches
every timing cycles through (a model never sees the same batch twice)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["draw_like"]


def draw_like(args: Any, seed: int, fresh: bool = True) -> Any:
    """A batch of the same structure, shapes and dtypes as `args`, drawn like it. Float tensors: each feature
    (column) resampled from its own values in the batch, so samples mix features they never had together.
    Integer tensors sorted along dim 0 (offsets) stay as they are; other integer tensors (indices): with
    `fresh`, each value drawn from the batch's values at their frequencies, except a share that new values
    take, uniform over the batch's range: the share of values seen once (Good-Turing's estimate of the chance
    that the next value was never seen), so a Zipf stream keeps its hot rows and gathers fresh cold ones, as a
    model's next batch does. Without `fresh`, permuted along dim 0 (every value kept: lengths keep their sum).
    Other values (bool tensors, scalars, non-tensors) are kept. A TorchRec KeyedJaggedTensor is drawn feature by
    feature (`_keyed_jagged`): each feature's ids from its own (its table's) range, its bag sizes shuffled
    across the samples."""
    gen = torch.Generator().manual_seed(seed)

    def draw(v: Any) -> Any:
        if _is_keyed_jagged(v):
            return _keyed_jagged(v, gen, fresh)
        return _redrawn(v, gen, fresh) if isinstance(v, torch.Tensor) else v

    return pytree.tree_map(draw, args, is_leaf=_is_keyed_jagged)


def _redrawn(x: torch.Tensor, gen: torch.Generator, fresh: bool) -> torch.Tensor:
    if x.dim() == 0 or x.numel() == 0 or x.dtype == torch.bool or x.is_complex():
        return x
    if x.is_floating_point():
        rows = x.reshape(x.shape[0], -1)
        pick = torch.randint(0, x.shape[0], rows.shape, generator=gen).to(x.device)
        return rows.gather(0, pick).reshape(x.shape)
    if x.dim() == 1 and bool((x[1:] >= x[:-1]).all()):
        return x  # offsets (or any sorted integers): their order is their meaning
    if not fresh:
        return x[torch.randperm(x.shape[0], generator=gen).to(x.device)]
    flat = x.reshape(-1)
    n = flat.numel()
    out = flat[torch.randint(0, n, (n,), generator=gen).to(x.device)]
    _, counts = flat.unique(return_counts=True)
    new = (torch.rand(n, generator=gen) < float((counts == 1).sum()) / n).to(x.device)
    lo, hi = int(flat.min()), int(flat.max())
    out[new] = torch.randint(lo, hi + 1, (int(new.sum()),), generator=gen, dtype=x.dtype).to(x.device)
    return out.reshape(x.shape)


def _is_keyed_jagged(v: Any) -> bool:
    """A TorchRec KeyedJaggedTensor (by its shape, without importing torchrec)."""
    return type(v).__name__ == "KeyedJaggedTensor" and all(
        hasattr(v, a) for a in ("keys", "values", "lengths", "weights_or_none", "stride"))


def _keyed_jagged(kjt: Any, gen: torch.Generator, fresh: bool) -> Any:
    """`kjt` drawn per feature: each feature's ids redrawn within its own values (`_redrawn`: they index its own
    table, which a draw over all features' ids would overrun), its per-sample weights resampled, its bag sizes
    permuted across the samples (`fresh`; kept otherwise); lengths and offsets given where the example gave
    them. A KJT whose features differ in batch (variable batch) is kept as it is."""
    keys, values, weights = kjt.keys(), kjt.values(), kjt.weights_or_none()
    lengths = kjt.lengths()
    batch = kjt.stride()
    if not keys or lengths.numel() != len(keys) * batch:
        return kjt
    per_key = lengths.view(len(keys), batch)
    ends = per_key.sum(1).cumsum(0).tolist()
    new_lengths, new_values, new_weights = [], [], []
    for f, end in enumerate(ends):
        start = ends[f - 1] if f else 0
        new_lengths.append(per_key[f][torch.randperm(batch, generator=gen).to(lengths.device)] if fresh else per_key[f])
        new_values.append(_redrawn(values[start:end], gen, fresh))
        if weights is not None:
            new_weights.append(_redrawn(weights[start:end], gen, fresh))
    lengths_out = torch.cat(new_lengths)
    offsets_out = torch.cat([lengths_out.new_zeros(1), lengths_out.cumsum(0)]).to(lengths.dtype)
    return type(kjt)(keys=list(keys), values=torch.cat(new_values),
                     weights=torch.cat(new_weights) if weights is not None else None,
                     lengths=lengths_out if getattr(kjt, "_lengths", None) is not None else None,
                     offsets=offsets_out if getattr(kjt, "_offsets", None) is not None else None)
