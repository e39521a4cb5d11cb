"""`torch.ops.autotune.embedding_interaction`: the table-batched embedding bags and DLRM's dot interaction as one op.

It takes what `batched_embedding_bag` takes (one concatenated weight, each table's first row, per-table indices
and offsets; sum pooling) and the dense vectors x, and returns `interaction(x, bags.view(B, T, D))`: (B, D +
pairs). Kernels are compiled for (tables, dim, self_interaction, index dtype, table dtype), take any batch and
bag sizes, and run on CPUs only (on a GPU, and for float64, PyTorch's implementation runs). The checks are the
batched op's (their messages name this op) and x's shape, dtype and device; on the CPU the kernel checks the
indices itself (its error flag).

Training: the forward writes no pooled rows, so the backward recomputes them (one PyTorch embedding bag over
the concatenated weight) and takes PyTorch's gradients of the interaction and the bags: x's and the weight's,
a dense gradient of the whole weight, as the batched op gives.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor

from .._torch_checks import fits, need
from ..batched_embedding_bag import torch_op as tbe
from ..embedding_bag.rows import table_dtype
from ..embedding_bag.torch_op import out_dtype, table_dim
from ..embedding_bag.workload import pool_dequantized
from ..interaction.torch_op import quarter_turn
from ..interaction.workload import dot_interaction
from ..template import InvalidDtype, Route, TorchBinding
from .workload import DOT_DTYPES, OP, RENAMED, Workload

__all__ = ["BINDING", "check", "embedding_interaction"]


def embedding_interaction(x: Tensor, weight: Tensor, table_offsets: Tensor, indices: list[Tensor],
                          offsets: list[Tensor], self_interaction: bool = False, include_last_offset: bool = False,
                          dot_dtype: str = "float32", validate: bool = True) -> Tensor:
    """DLRM's dot interaction of x (B, D) with the T tables' pooled bags: `interaction(x, batched_embedding_bag(
    weight, table_offsets, indices, offsets, "sum", include_last_offset).view(B, T, D), self_interaction)`.
    `dot_dtype="bfloat16"` allows kernels to multiply bf16 roundings of the features (the workload's field);
    PyTorch's implementation computes in full precision either way."""
    ly = tbe.batched_embedding_bag(weight, table_offsets, indices, offsets, "sum", include_last_offset)
    return dot_interaction(x, ly.view(ly.shape[0], len(indices), table_dim(weight)).to(x.dtype), self_interaction)


def _pairs(tables: int, self_interaction: bool) -> int:
    f = tables + 1
    return f * (f + 1) // 2 if self_interaction else f * (f - 1) // 2


# ---- checks -------------------------------------------------------------------------------------------------
def check(x: Tensor, weight: Tensor, table_offsets: Tensor, indices: list[Tensor], offsets: list[Tensor],
          self_interaction: bool = False, include_last_offset: bool = False, dot_dtype: str = "float32",
          validate: bool = True) -> None:
    """The batched op's checks of the bags (metadata only), then x: (batch, dim) of the tables' output dtype
    (float32; float64 for a float64 table), on their device, contiguous; dot_dtype one of DOT_DTYPES."""
    need(dot_dtype in DOT_DTYPES, OP, lambda: f"dot_dtype must be one of {', '.join(DOT_DTYPES)}, got {dot_dtype!r}")
    with RENAMED:
        tbe.check(weight, table_offsets, indices, offsets, "sum", include_last_offset, validate)
    xs = x.shape
    if (len(xs) == 2 and xs[1] == table_dim(weight) and xs[0] == offsets[0].shape[0] - int(include_last_offset)
            and x.dtype is out_dtype(weight) and x.device == weight.device and fits(x)):
        return
    _explain(x, weight, offsets, include_last_offset)


def _explain(x: Tensor, weight: Tensor, offsets: list[Tensor], include_last_offset: bool) -> None:
    dim, batch = table_dim(weight), offsets[0].shape[0] - int(include_last_offset)
    need(x.dim() == 2 and x.shape[1] == dim, OP, f"x must be (batch, {dim}) (the tables' dim), got shape "
         f"{tuple(x.shape)}")
    need(x.shape[0] == batch, OP, f"x has batch {x.shape[0]} but offsets[0] holds {batch} bags")
    need(x.dtype is out_dtype(weight), OP, f"x must be {out_dtype(weight)} for {weight.dtype} tables, got {x.dtype}",
         InvalidDtype)
    need(x.device == weight.device, OP, f"x is on {x.device} but weight on {weight.device}: one device")
    need(x.is_contiguous(), OP, "x must be contiguous (call .contiguous() on it)")


def fake(x: Tensor, weight: Tensor, table_offsets: Tensor, indices: list[Tensor], offsets: list[Tensor],
         self_interaction: bool = False, include_last_offset: bool = False, dot_dtype: str = "float32",
         validate: bool = True) -> Tensor:
    return x.new_empty(x.shape[0], x.shape[1] + _pairs(len(indices), self_interaction))


def route(x: Tensor, weight: Tensor, table_offsets: Tensor, indices: list[Tensor], offsets: list[Tensor],
          self_interaction: bool = False, include_last_offset: bool = False, dot_dtype: str = "float32",
          validate: bool = True) -> Route | str:
    index = tbe._index_dtype(indices)
    signature = (len(indices), table_dim(weight), self_interaction, index, table_dtype(weight), dot_dtype)
    batch = x.shape[0]
    if batch < 1:  # nothing to compute
        return Route(signature, 0)
    if weight.device.type != "cpu":
        return "the fused kernel runs on CPUs only (batched_embedding_bag and interaction have GPU kernels)"
    if x.dtype is not torch.float32 or signature[4] is None:
        return f"kernels take float32 x and float32, float16, bfloat16 or fused int8 tables, got {weight.dtype}"
    if index == "int32" and sum(i.numel() for i in indices) >= 2**31:
        return "the indices overflow int32 offsets"
    if weight.data_ptr() % 64:  # e.g. a row view of a larger tensor
        return "the CPU kernels need a 64-byte aligned weight (TVM's buffers assume it for aligned vector loads)"
    return Route(signature, batch)


def run(chunks: Sequence[Any], x: Tensor, weight: Tensor, table_offsets: Tensor, indices: list[Tensor],
        offsets: list[Tensor], self_interaction: bool = False, include_last_offset: bool = False,
        dot_dtype: str = "float32", validate: bool = True) -> Tensor:
    """The kernel reads each table's indices and offsets where they are (workload.bag_columns: no copy into one
    layout) and checks them itself; a last offset per table (include_last_offset) is checked here, then left
    out (views)."""
    if include_last_offset:
        if validate and torch.stack([o[-1] for o in offsets]).tolist() != [i.numel() for i in indices]:
            with RENAMED:
                tbe._explain_bag_edges(indices, offsets, include_last_offset)
        offsets = [o[:-1] for o in offsets]
    return chunks[0].kernel(x, weight, table_offsets, list(indices), list(offsets))


def compiled(w: Workload) -> tuple[Any, ...]:
    return (w.tables, w.dim, w.self_interaction, w.index_dtype, w.dtype, w.dot_dtype)


def describe(signature: tuple[Any, ...]) -> str:
    tables, dim, self_interaction, index, dtype, dot_dtype = signature
    return (f"tables={tables} dim={dim} self_interaction={self_interaction} index={index} dtype={dtype} "
            f"dot_dtype={dot_dtype}")


# ---- the calls a kernel must serve (autotune check) ---------------------------------------------------------
Case = tuple[str, tuple[Any, ...], dict[str, Any]]


CASE_ROWS = 10_000  # the most rows of a table in the cases


def cases(w: Workload, seed: int, count: int) -> Iterable[Case]:
    """The batched op's cases (batch sizes, include_last_offset, empty bags, edge indices, a long bag, other table
    sizes, random batches), each with dense vectors of its batch; then zeros, values of magnitude 1e3, and dot
    products of x with the first table's rows that cancel (float32 tables). Tables hold at most CASE_ROWS rows:
    no table size is compiled in, and each case has tables of its own (at the DLRM's 1.5M rows, 380 MB each)."""
    gen = torch.Generator().manual_seed(seed)
    bags = dataclasses.replace(w.bags, rows=tuple(min(r, CASE_ROWS) for r in w.rows))
    out = []
    for name, (weight, table_offsets, indices, offsets), kw in tbe.cases(bags, seed, count):
        last = kw["include_last_offset"]
        x = torch.randn(offsets[0].numel() - int(last), w.dim, generator=gen)
        out.append((name, (x, weight, table_offsets, indices, offsets),
                    {"self_interaction": w.self_interaction, "include_last_offset": last, "dot_dtype": w.dot_dtype}))
    name, (x, weight, table_offsets, indices, offsets), kw = out[0]
    out.append(("zeros", (x * 0, weight, table_offsets, indices, offsets), kw))
    if w.dtype == "float32":
        large = weight * 1e3  # one copy of the tables for both cases
        out.append(("values of magnitude 1e3", (x * 1e3, large, table_offsets, indices, offsets), kw))
        first_table = tbe.batched_embedding_bag(weight, table_offsets, indices, offsets)[:, :w.dim]
        cancel = (quarter_turn(first_table) + 1e-3 * x) * 1e3  # nearly orthogonal to the first table's bags
        out.append(("cancelling dot products of magnitude 1e3", (cancel.contiguous(), large, table_offsets,
                                                                 indices, offsets), kw))
    return out


# ---- autograd: the pooled rows recomputed, PyTorch's gradients of the bags and the interaction -------------
def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    # (`inputs` shadows nothing it needs: it is the keyword torch passes the op's arguments by)
    x, weight, table_offsets, indices, offsets, self_interaction, include_last_offset = inputs[:7]
    ctx.save_for_backward(x, weight, table_offsets, *indices, *offsets)
    ctx.options = (len(indices), self_interaction, include_last_offset)


def _backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    """x's and the weight's gradients: the bags pooled again by one embedding bag over the concatenated weight
    (global rows: each table's indices plus its first row), then autograd through it and the interaction."""
    tables, self_interaction, include_last_offset = ctx.options
    # one entry per argument the call passed (a compiled call may leave trailing defaults out), None per list item
    nones = (None, [None] * tables, [None] * tables) + (None,) * (len(ctx.needs_input_grad) - 5)
    want_x, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    x, weight, table_offsets, *rest = ctx.saved_tensors
    if not (want_x or want_weight):
        return (None, None, *nones)
    idx, offs, shift, _ = tbe.layout(rest[:tables], rest[tables:], include_last_offset)
    rows = idx.long() + torch.repeat_interleave(table_offsets[:-1], shift.diff(), output_size=idx.numel())
    with torch.enable_grad():
        x_ = x.detach().requires_grad_(want_x)
        w_ = weight.detach().requires_grad_(want_weight)
        bags = pool_dequantized(table_dtype(weight) or "float32", w_, rows, offs.long(), mode="sum",
                                include_last_offset=True)  # (T * B, D), table-major
        ly = bags.view(tables, x.shape[0], table_dim(weight)).transpose(0, 1).to(x.dtype)
        out = dot_interaction(x_, ly, self_interaction)
        wanted = [t for t, want in ((x_, want_x), (w_, want_weight)) if want]
        grads = iter(torch.autograd.grad(out, wanted, grad))
    return (next(grads) if want_x else None, next(grads) if want_weight else None, *nones)


BINDING = TorchBinding(
    op=embedding_interaction, fake=fake, check=check, route=route, run=run, compiled=compiled,
    size=lambda w: w.batch, any_size=True, describe=describe, cases=cases, backward=_backward,
    setup_context=_setup_context)
