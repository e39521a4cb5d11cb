"""`torch.ops.autotune.embedding_bag` and `EmbeddingBag`: how the embedding bag appears in PyTorch.

The op is F.embedding_bag with the weight first, as the kernels take it. Kernels are compiled for (dim, mode,
index dtype, per_sample_weights, padding_idx, include_last_offset, table dtype) and take any batch, bag sizes and
table rows. The weight may hold reduced-precision rows (rows.py): float16 or bfloat16, or uint8 rows in FBGEMM's
fused row-wise int8 layout (dim values, then a float32 scale and bias); the output is float32 whatever the table
(the pooling of its float32 values), and such tables are for inference (no gradient).
Inputs are checked as PyTorch checks them (indices in range, well-formed offsets: checks.py). On the CPU the
kernels check the data themselves as they gather (an error flag raised after the call, always on: it is what
keeps them inside their tensors), so `check` reads only metadata; on a GPU `check` reads the data before the
call (waiting for it) unless `validate=False`. The backward is PyTorch's own.
"""

from __future__ import annotations

import random
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._torch_checks import need
from ..template import InvalidDtype, ModuleRule, Route, TorchBinding
from .checks import OP, check, out_dtype
from .pages import in_huge_pages
from .rows import DTYPES, FUSED_BYTES, quantize, table_dtype
from .workload import Workload, boundaries, inputs, pool_dequantized, row_indices, table

__all__ = ["BINDING", "EmbeddingBag", "QuantizedEmbeddingBag", "embedding_bag", "table_dim"]

ATEN_MODES = {"sum": 0, "mean": 1, "max": 2}  # PyTorch's internal mode numbers (aten::_embedding_bag)


def embedding_bag(weight: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor] = None,
                  mode: str = "sum", include_last_offset: bool = False, padding_idx: Optional[int] = None,
                  validate: bool = True) -> Tensor:
    """F.embedding_bag(indices, weight, offsets, ...) with the weight first, as the kernels take it; a
    reduced-precision table (float16, bfloat16, or uint8 fused int8 rows) pools its float32 values."""
    if validate and mode == "max" and offsets.device.type == "cpu":
        _check_ordered(offsets)  # the one data check PyTorch's CPU max mode lacks (CUDA inputs: `check`)
    return pool_dequantized(table_dtype(weight) or "float32", weight, indices, offsets, per_sample_weights,
                            mode=mode, include_last_offset=include_last_offset, padding_idx=padding_idx)


def table_dim(weight: Tensor) -> int:
    """The embedding dimension of a table: its width, less the scale and bias of fused int8 rows."""
    return weight.shape[1] - FUSED_BYTES if weight.dtype is torch.uint8 else weight.shape[1]


def _check_ordered(offsets: Tensor) -> None:
    """Offsets non-decreasing: F.embedding_bag checks it for sum and mean, not for max (a pass over the offsets
    only, on PyTorch's path only: the kernels check their bags themselves)."""
    o = offsets.detach().numpy()
    need(bool((o[1:] >= o[:-1]).all()), OP, "offsets must be non-decreasing")


def fake(weight: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor] = None,
         mode: str = "sum", include_last_offset: bool = False, padding_idx: Optional[int] = None,
         validate: bool = True) -> Tensor:
    return weight.new_empty(offsets.shape[0] - int(include_last_offset), table_dim(weight), dtype=out_dtype(weight))


_INDEX_NAMES = {torch.int64: "int64", torch.int32: "int32"}


def _index_dtype(indices: Tensor, offsets: Tensor) -> str:
    if indices.dtype is offsets.dtype:
        name = _INDEX_NAMES.get(indices.dtype)
        if name is not None:
            return name
    return f"{indices.dtype}/{offsets.dtype}" if indices.dtype != offsets.dtype else str(indices.dtype)


def route(weight: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor] = None,
          mode: str = "sum", include_last_offset: bool = False, padding_idx: Optional[int] = None,
          validate: bool = True) -> Route | str:
    """Attributes read once each, cheapest first (`is_cpu`, not `device.type`): this runs on every call."""
    pad = padding_idx + weight.shape[0] if padding_idx is not None and padding_idx < 0 else padding_idx
    bags = offsets.numel() - include_last_offset
    signature = (table_dim(weight), mode, _index_dtype(indices, offsets), per_sample_weights is not None, pad,
                 include_last_offset, table_dtype(weight))
    if bags < 1 or not indices.numel():  # nothing to gather: not worth a kernel
        return Route(signature, 0)
    if signature[-1] is None:
        return f"kernels take float32, float16, bfloat16 or fused int8 tables, got {weight.dtype}"
    if weight.is_cpu:
        if weight.data_ptr() % 64:  # e.g. a row view of a larger tensor
            return "the CPU kernels need a 64-byte aligned table (TVM's buffers assume it for aligned vector loads)"
    elif weight.is_cuda and weight.data_ptr() % 16:
        return "the GPU kernels need a 16-byte aligned table (vector loads)"
    return Route(signature, bags)


def run(chunks: Sequence[Any], weight: Tensor, indices: Tensor, offsets: Tensor,
        per_sample_weights: Optional[Tensor] = None, mode: str = "sum", include_last_offset: bool = False,
        padding_idx: Optional[int] = None, validate: bool = True) -> Tensor:
    if per_sample_weights is None:
        return chunks[0].kernel(weight, indices, offsets)
    return chunks[0].kernel(weight, indices, offsets, per_sample_weights)


def compiled(w: Workload) -> tuple[Any, ...]:
    return (w.dim, w.mode, w.index_dtype, w.per_sample_weights, w.padding_idx, w.include_last_offset, w.dtype)


def describe(signature: tuple[Any, ...]) -> str:
    dim, mode, index, weighted, pad, last, dtype = signature
    return (f"dim={dim} mode={mode} index={index} per_sample_weights={weighted} padding_idx={pad} "
            f"include_last_offset={last} dtype={dtype}")


# ---- the calls a kernel must serve (autotune check) ---------------------------------------------------------
Case = tuple[str, tuple[Any, ...], dict[str, Any]]


def _call(w: Workload, name: str, tensors: Sequence[Tensor]) -> Case:
    weight, indices, offsets, *psw = tensors
    return name, (weight, indices, offsets), {"per_sample_weights": psw[0] if psw else None, "mode": w.mode,
                                              "include_last_offset": w.include_last_offset,
                                              "padding_idx": w.padding_idx}


def _bags(w: Workload, sizes: Sequence[int], seed: int, rows: int | None = None) -> list[Tensor]:
    """The reference-order tensors of bags of the given sizes (w's table, or one of `rows` rows)."""
    rows = w.rows if rows is None else rows
    rng = np.random.default_rng(seed)
    offsets = boundaries(np.asarray(sizes, dtype=np.int64))
    indices = row_indices(rows, int(offsets[-1]), w.distribution, w.zipf_exponent, rng)
    if w.padding_idx is not None and len(indices):
        indices[rng.random(len(indices)) < 0.1] = w.padding_idx
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, w.index_dtype)
    out = [table(rows, w.dim, w.dtype, seed), torch.from_numpy(indices).to(dtype),
           torch.from_numpy(offsets if w.include_last_offset else offsets[:-1]).to(dtype)]
    if w.per_sample_weights:
        out.append(torch.rand(len(indices), generator=gen))
    return out


def cases(w: Workload, seed: int, count: int) -> Iterable[Case]:
    """The tuned batch, batches 1 and one past it and above twice it, empty bags (first, last, every third),
    the largest and smallest index, one bag far longer than the tuned pooling, another table size, and `count`
    random batches."""
    rng = random.Random(seed)
    hi = max(1, w.pooling[1])
    out = [_call(w, f"tuned batch {w.batch}", inputs(w, seed))]
    for i, batch in enumerate(dict.fromkeys([1, w.batch + 1, 2 * w.batch + 3])):
        out.append(_call(w, f"batch {batch}", _bags(w, [rng.randint(1, hi) for _ in range(batch)], seed + 1 + i)))
    bags = max(w.batch, 4)
    sizes = [0 if b % 3 == 0 or b == bags - 1 else rng.randint(1, hi) for b in range(bags)]
    out.append(_call(w, "empty bags (first, last, every third)", _bags(w, sizes, seed + 5)))
    edge = _bags(w, [rng.randint(1, hi) for _ in range(w.batch)], seed + 6)
    edge[1][-1], edge[1][0] = 0, w.rows - 1
    out.append(_call(w, f"largest index {w.rows - 1} and index 0", edge))
    out.append(_call(w, f"one bag of {4 * hi + 1} indices", _bags(w, [4 * hi + 1] + [1] * (w.batch - 1), seed + 7)))
    out.append(_call(w, f"a table of {w.rows + 7} rows", _bags(w, [rng.randint(1, hi) for _ in range(w.batch)],
                                                             seed + 8, rows=w.rows + 7)))
    for i in range(count):
        batch = rng.randint(1, 2 * w.batch + 8)
        sizes = [rng.randint(w.pooling[0], w.pooling[1]) for _ in range(batch)]
        sizes[rng.randrange(batch)] = hi  # at least one index: an all-empty call is PyTorch's by design
        out.append(_call(w, f"random batch {batch} (seed {seed + 10 + i})", _bags(w, sizes, seed + 10 + i)))
    return out


# ---- autograd: PyTorch's own backward -------------------------------------------------------------------------
def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    # (`inputs` shadows nothing it needs: it is the keyword torch passes the op's arguments by)
    weight, indices, offsets, psw, mode, include_last_offset, padding_idx, _ = inputs
    ctx.save_for_backward(weight, indices, offsets, psw)
    ctx.options = (mode, include_last_offset, padding_idx)


def _backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    """PyTorch's own backward (aten::_embedding_bag_backward), after recomputing the bag bookkeeping it needs
    (bag of each index, bag sizes, argmax for mode=max) with aten::_embedding_bag: a training step pays one
    PyTorch forward more."""
    weight, indices, offsets, psw = ctx.saved_tensors
    mode, include_last_offset, padding_idx = ctx.options
    pad = -1 if padding_idx is None else padding_idx + weight.shape[0] if padding_idx < 0 else padding_idx
    m = ATEN_MODES[mode]
    _, offset2bag, bag_size, max_indices = torch.ops.aten._embedding_bag(
        weight.detach(), indices, offsets, False, m, False, psw, include_last_offset, pad)
    grad_weight = grad_psw = None
    if ctx.needs_input_grad[0]:
        grad_weight = torch.ops.aten._embedding_bag_backward(
            grad, indices, offsets, offset2bag, bag_size, max_indices, weight.shape[0], False, m, False, psw, pad)
    if psw is not None and ctx.needs_input_grad[3]:
        grad_psw = torch.ops.aten._embedding_bag_per_sample_weights_backward(
            grad, weight, indices, offsets, offset2bag, m, pad)
    return grad_weight, None, None, grad_psw, None, None, None, None


# ---- the drop-in module and its optimize rule -----------------------------------------------------------------
class EmbeddingBag(nn.EmbeddingBag):
    """`nn.EmbeddingBag` (same constructor, `from_pretrained`, weight Parameter, state dict) on tuned kernels.

    The forward runs `torch.ops.autotune.embedding_bag`; its backward is PyTorch's, so the module trains.
    What the kernels do not cover runs `nn.EmbeddingBag.forward` itself: `max_norm` (it renormalises rows in
    place), and sparse or frequency-scaled gradients while gradients are being taken. Inputs are made contiguous
    (a copy only when they are not); `validate=False` skips the checks of indices and offsets.
    """

    def __init__(self, *args: Any, validate: bool = True, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.validate = validate

    @classmethod
    def from_module(cls, module: nn.EmbeddingBag, validate: bool = True) -> "EmbeddingBag":
        """A tuned twin of `module` that shares its weight Parameter (optimizers holding it keep working), as it
        is: `module.weight.data = at.in_huge_pages(module.weight.data)` moves a large table into 2 MB pages
        (pages.py), where its random rows gather faster."""
        new = cls(module.num_embeddings, module.embedding_dim, max_norm=module.max_norm, norm_type=module.norm_type,
                  scale_grad_by_freq=module.scale_grad_by_freq, mode=module.mode, sparse=module.sparse,
                  _weight=module.weight.detach(), include_last_offset=module.include_last_offset,
                  padding_idx=module.padding_idx, validate=validate)
        new.weight = module.weight
        new.train(module.training)
        return new

    def _pytorch_path(self) -> bool:
        grads = torch.is_grad_enabled() and self.weight.requires_grad
        return self.max_norm is not None or (grads and (self.sparse or self.scale_grad_by_freq))

    @classmethod
    def quantized(cls, module: nn.EmbeddingBag, dtype: str) -> "QuantizedEmbeddingBag":
        """An inference twin of `module` whose table is converted once to `dtype` rows (rows.py: "float16",
        "bfloat16", or "int8", FBGEMM's fused row-wise rows): a quarter of the bytes per lookup for int8."""
        return QuantizedEmbeddingBag.from_module(module, dtype)

    def forward(self, input: Tensor, offsets: Optional[Tensor] = None,
                per_sample_weights: Optional[Tensor] = None) -> Tensor:
        if self._pytorch_path() or not _bag_input(input, offsets):
            return super().forward(input, offsets, per_sample_weights)  # PyTorch's result, or its error
        return torch.ops.autotune.embedding_bag(
            self.weight, *_flat_bags(input, offsets, per_sample_weights), self.mode, self.include_last_offset,
            self.padding_idx, self.validate)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", autotune"


def _bag_input(input: Tensor, offsets: Optional[Tensor]) -> bool:
    """nn.EmbeddingBag's two forms: 1-D indices with offsets, or (bags, n) fixed-size bags without."""
    return input.dim() in (1, 2) and (input.dim() == 2) != (offsets is not None)


def _flat_bags(input: Tensor, offsets: Optional[Tensor], per_sample_weights: Optional[Tensor]
               ) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """(indices, offsets, per_sample_weights) as the op takes them, contiguous (a copy only when they are not):
    (bags, n) fixed-size bags become 1-D indices with offsets every n."""
    if input.dim() == 2:
        offsets = torch.arange(0, input.numel(), input.shape[1], dtype=input.dtype, device=input.device)
        input = input.reshape(-1)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
    assert offsets is not None
    return (input.contiguous(), offsets.contiguous(),
            None if per_sample_weights is None else per_sample_weights.contiguous())


class QuantizedEmbeddingBag(nn.Module):
    """An inference embedding bag over a reduced-precision table (rows.py), pooled by
    `torch.ops.autotune.embedding_bag` into float32: `EmbeddingBag.quantized(bag, "int8")` converts an
    `nn.EmbeddingBag`'s table once; `QuantizedEmbeddingBag(weight, ...)` takes a table already in float16,
    bfloat16 or FBGEMM's fused int8 rows (uint8, e.g. from `torch.ops.quantized.embedding_bag_byte_prepack`) as
    it is. The table is a buffer (saved in the state dict), not a Parameter: it trains no more."""

    def __init__(self, weight: Tensor, mode: str = "sum", include_last_offset: bool = False,
                 padding_idx: Optional[int] = None, validate: bool = True):
        super().__init__()
        need(table_dtype(weight) not in (None, "float32"), OP, "QuantizedEmbeddingBag takes a float16, bfloat16 or "
             f"uint8 (fused int8 rows) table, got {weight.dtype}; convert one with EmbeddingBag.quantized",
             InvalidDtype)
        self.register_buffer("weight", weight.detach().contiguous())
        self.mode, self.include_last_offset, self.padding_idx, self.validate = (
            mode, include_last_offset, padding_idx, validate)

    @classmethod
    def from_module(cls, module: nn.EmbeddingBag, dtype: str) -> "QuantizedEmbeddingBag":
        need(isinstance(module, nn.EmbeddingBag), OP, f"expected an nn.EmbeddingBag, got {type(module).__name__}")
        need(module.max_norm is None, OP, "max_norm renormalises rows as they are read: it has no quantized form")
        need(dtype in DTYPES and dtype != "float32", OP, f"dtype must be float16, bfloat16 or int8, got {dtype!r}")
        return cls(in_huge_pages(quantize(module.weight, dtype)), module.mode, module.include_last_offset,
                   module.padding_idx)

    @property
    def dtype(self) -> str:
        return table_dtype(self.weight)

    def forward(self, input: Tensor, offsets: Optional[Tensor] = None,
                per_sample_weights: Optional[Tensor] = None) -> Tensor:
        need(_bag_input(input, offsets), OP, "input must be 1-D indices with offsets, or 2-D (bags, n) without")
        return torch.ops.autotune.embedding_bag(
            self.weight, *_flat_bags(input, offsets, per_sample_weights), self.mode, self.include_last_offset,
            self.padding_idx, self.validate)

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[0]}, {self.weight.shape[1] - (FUSED_BYTES if self.dtype == 'int8' else 0)}, "
                f"dtype={self.dtype}, mode={self.mode!r}, autotune")


def _swap_embedding_bag(module: nn.Module, next_module: Any, has_kernel: Any, validate: bool) -> Any:
    """nn.EmbeddingBag -> EmbeddingBag (sharing its weight), where a kernel has its compiled-in options."""
    if not isinstance(module, nn.EmbeddingBag) or isinstance(module, EmbeddingBag):
        return None
    if module.max_norm is not None:
        return "max_norm renormalises rows in place: PyTorch's path"
    if not has_kernel(lambda w: w.dim == module.embedding_dim and w.mode == module.mode
                      and w.include_last_offset == module.include_last_offset and w.padding_idx == module.padding_idx):
        return (f"no embedding_bag kernel for dim={module.embedding_dim} mode={module.mode} "
                f"padding_idx={module.padding_idx} include_last_offset={module.include_last_offset}")
    return EmbeddingBag.from_module(module, validate=validate), False


BINDING = TorchBinding(
    op=embedding_bag, fake=fake, check=check, route=route, run=run, compiled=compiled, size=lambda w: w.batch,
    any_size=True, describe=describe, cases=cases, backward=_backward, setup_context=_setup_context,
    replayable=True,  # on the CPU `check` reads metadata only, and the kernels check every index and bag
    rules=(ModuleRule("nn.EmbeddingBag -> EmbeddingBag", _swap_embedding_bag),),
    exports=(("EmbeddingBag", EmbeddingBag), ("QuantizedEmbeddingBag", QuantizedEmbeddingBag),
             ("in_huge_pages", in_huge_pages)))
