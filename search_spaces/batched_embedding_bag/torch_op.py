"""`torch.ops.autotune.batched_embedding_bag` and `BatchedEmbeddingBag`: the table-batched embedding bag in PyTorch.

The op takes what T `F.embedding_bag` calls would take, table by table: `indices[t]` and `offsets[t]` local to
table t, whose rows are `weight[table_offsets[t]:table_offsets[t+1]]` of one concatenated weight (FBGEMM's TBE
weight), and returns their outputs side by side, (B, T*D). The kernels read FBGEMM's layout (all indices
concatenated, table-major offsets of T*B+1); `layout` builds it in a handful of tensor ops. Kernels are
compiled for (tables, dim, mode, index dtype, table dtype) and take any batch, table sizes and bag sizes. The
weight may hold reduced-precision rows, as embedding_bag's (its rows.py): the output is float32 whatever the
tables, and such tables are for inference.

Checks (validate=True): the metadata here (no pass over the data); each table's first offset (and, with
include_last_offset, its last) from T+1 values of the built layout; on the CPU the indices and bags inside
the kernel (its error flag: the template's after_call); on a GPU on the host, before the call, in one pass
with one synchronisation (reading a GPU kernel's flag would wait for it). The backward is PyTorch's
embedding_bag backward, once over the concatenated weight.
"""

from __future__ import annotations

import random
from itertools import accumulate
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .._torch_checks import need, same_device_contiguous
from ..embedding_bag import pages
from ..embedding_bag.rows import quantize, table_dtype
from ..embedding_bag.checks import explain_table, out_dtype, table_ok
from ..embedding_bag.torch_op import ATEN_MODES, table_dim
from ..embedding_bag.workload import MODES, boundaries, pool_dequantized, row_indices, table
from ..template import IndexOutOfRange, InvalidDtype, Route, TorchBinding
from .workload import Workload

__all__ = ["BINDING", "BatchedEmbeddingBag", "batched_embedding_bag", "check", "check_data", "concat_tables", "layout"]

OP = "batched_embedding_bag"
_INDEX_DTYPES = (torch.int32, torch.int64)
_NUMPY = {torch.int32: np.int32, torch.int64: np.int64}


def batched_embedding_bag(weight: Tensor, table_offsets: Tensor, indices: list[Tensor], offsets: list[Tensor],
                          mode: str = "sum", include_last_offset: bool = False, validate: bool = True) -> Tensor:
    """FBGEMM's table-batched embedding bag: `torch.cat([F.embedding_bag(indices[t], weight[table_offsets[t]:
    table_offsets[t+1]], offsets[t], mode=mode, include_last_offset=include_last_offset) for t], dim=1)`, over
    the tables' float32 values."""
    rows, dtype = table_offsets.tolist(), table_dtype(weight) or "float32"
    return torch.cat([pool_dequantized(dtype, weight[rows[t]:rows[t + 1]], i, o, mode=mode,
                                       include_last_offset=include_last_offset)
                      for t, (i, o) in enumerate(zip(indices, offsets))], dim=1)


# ---- checks -----------------------------------------------------------------------------------------------
def check(weight: Tensor, table_offsets: Tensor, indices: list[Tensor], offsets: list[Tensor], mode: str = "sum",
          include_last_offset: bool = False, validate: bool = True) -> None:
    """What T F.embedding_bag calls would reject, from the tensors' metadata only (the data: module doc).

    The per-table tensors may be strided (the layout copies them anyway); weight and table_offsets must be
    contiguous, as the kernels read them in place."""
    need(mode in MODES, OP, f"mode must be one of {MODES}, got {mode!r}")
    need(weight.dim() == 2, OP, f"weight must be 2-D (rows of all tables, dim), got shape {tuple(weight.shape)}")
    if not table_ok(weight):
        explain_table(OP, weight)
    tables = len(indices)
    need(tables >= 1, OP, "indices must list at least one table")
    need(len(offsets) == tables, OP, f"indices lists {tables} tables but offsets lists {len(offsets)}: one "
         "tensor of each per table")
    need(table_offsets.dtype == torch.int64, OP, f"table_offsets must be int64, got {table_offsets.dtype}",
         InvalidDtype)
    need(table_offsets.shape == (tables + 1,), OP, f"table_offsets must hold tables + 1 = {tables + 1} entries (each "
         f"table's first row, then the weight's rows), got shape {tuple(table_offsets.shape)}")
    same_device_contiguous(OP, weight=weight, table_offsets=table_offsets)
    bags, device = offsets[0].shape, weight.get_device()
    for t, (i, o) in enumerate(zip(indices, offsets)):  # one test per table: this loop is most of check's cost
        if not (i.dtype in _INDEX_DTYPES and o.dtype in _INDEX_DTYPES and i.dim() == 1 and o.shape == bags
                and len(bags) == 1 and i.get_device() == device and o.get_device() == device):
            _explain(t, i, o, offsets[0], weight.device, include_last_offset)
    need(bags[0] >= int(include_last_offset), OP,
         "offsets[t] must hold at least one element with include_last_offset=True")


def _explain(t: int, i: Tensor, o: Tensor, first: Tensor, device: Any, include_last_offset: bool) -> None:
    """Raise the error of table t's tensors, which failed check's one-line test."""
    for name, x in ((f"indices[{t}]", i), (f"offsets[{t}]", o)):
        need(x.dtype in _INDEX_DTYPES, OP, f"{name} must be int32 or int64, got {x.dtype}", InvalidDtype)
        need(x.dim() == 1, OP, f"{name} must be 1-D, got shape {tuple(x.shape)}")
        need(x.device == device, OP, f"all tensors must be on one device, got weight on {device} and {name} on "
             f"{x.device}")
    per = "one bag per sample" + (", then the end of the last bag" if include_last_offset else "")
    need(False, OP, f"offsets[{t}] has {o.numel()} entries but offsets[0] has {first.numel()}: every table takes "
         f"the same batch ({per})")


def _bag_edges_ok(offs: Tensor, shift: Tensor, last: Tensor | None, bags: int) -> bool:
    """Each table's offsets start at 0 (its bags at its own first index) and, with include_last_offset, end at its
    indices' length: T+1 values of the layout, which does not carry them otherwise (FBGEMM's has one boundary
    between two tables' bags)."""
    ok = torch.equal(offs[::bags], shift)
    return ok and (last is None or torch.equal(last + shift[:-1], shift[1:]))


def _explain_bag_edges(indices: Sequence[Tensor], offsets: Sequence[Tensor], include_last_offset: bool) -> None:
    for t, (i, o) in enumerate(zip(indices, offsets)):
        first, end = int(o[0]), int(o[-1])
        need(first == 0, OP, f"offsets[{t}][0] must be 0 (a table's first bag starts at its first index), got "
             f"{first}")
        need(not include_last_offset or end == i.numel(), OP, f"offsets[{t}][-1] = {end} must equal len(indices"
             f"[{t}]) = {i.numel()} with include_last_offset=True (it is the end of table {t}'s last bag)")


def check_data(weight: Tensor, table_offsets: Tensor, idx: Tensor, offs: Tensor, shift: Tensor,
               last: Tensor | None, indices: Sequence[Tensor], offsets: Sequence[Tensor],
               include_last_offset: bool) -> None:
    """Every data check, on the built layout, in one pass and one synchronisation (for GPU calls, whose kernels'
    flag is not read): table_offsets from 0 to the weight's rows, each index inside its own table, offsets
    non-decreasing, the bag edges (_bag_edges_ok). The messages come from a second look where one failed."""
    tables, bags = len(indices), (offs.numel() - 1) // len(indices)
    sizes = table_offsets.diff()
    bad_tables = (sizes < 0).any() | (table_offsets[0] != 0) | (table_offsets[-1] != weight.shape[0])
    table_of = torch.repeat_interleave(torch.arange(tables, device=idx.device), shift.diff(),
                                       output_size=idx.numel())
    bad_index = ((idx < 0) | (idx >= sizes.clamp(min=0)[table_of])).any()
    decreasing = (offs[1:] < offs[:-1]).any()
    edges = (offs[::bags] != shift).any()
    if last is not None:
        edges = edges | (last + shift[:-1] != shift[1:]).any()
    flags = torch.stack([bad_tables, bad_index, decreasing, edges]).tolist()
    if not any(flags):
        return
    need(not flags[0], OP, f"table_offsets must rise from 0 to the weight's {weight.shape[0]} rows, got "
         f"{table_offsets.tolist()}")
    if flags[3]:
        _explain_bag_edges(indices, offsets, include_last_offset)
    if flags[2]:
        _explain_offsets(indices, offsets)
    _explain_indices(table_offsets, indices)
    need(False, OP, f"malformed inputs (flags {flags}) that a second look did not place")


def _explain_offsets(indices: Sequence[Tensor], offsets: Sequence[Tensor]) -> None:
    for t, (i, o) in enumerate(zip(indices, offsets)):
        o = o.cpu().numpy()
        down = np.flatnonzero(o[1:] < o[:-1])
        if len(down):
            k = int(down[0])
            need(False, OP, f"offsets[{t}] must be non-decreasing, got offsets[{t}][{k + 1}] = {int(o[k + 1])} "
                 f"after {int(o[k])}")
        need(not len(o) or o[-1] <= i.numel(), OP, f"offsets[{t}][-1] = {int(o[-1]) if len(o) else 0} exceeds "
             f"len(indices[{t}]) = {i.numel()}")


def _explain_indices(table_offsets: Tensor, indices: Sequence[Tensor]) -> None:
    rows = table_offsets.diff().tolist()
    for t, i in enumerate(indices):
        i = i.cpu().numpy()
        bad = np.flatnonzero((i < 0) | (i >= rows[t]))
        if len(bad):
            k = int(bad[0])
            need(False, OP, f"indices[{t}] must be in [0, {rows[t]}) (its table's rows), got {int(i[k])} at "
                 f"position {k}", IndexOutOfRange)


# ---- the tables' one buffer ---------------------------------------------------------------------------------
def concat_tables(tables: Sequence[Tensor]) -> Tensor:
    """The tables concatenated into one contiguous (sum rows, D) tensor, on a CPU in 2 MB pages where the
    platform gives them (embedding_bag/pages.py: nearly every lookup of a large table in 4 KB pages misses the
    TLB)."""
    first = tables[0]
    if first.device.type != "cpu":
        return torch.cat(list(tables)).contiguous()
    out = pages.empty((sum(t.shape[0] for t in tables), first.shape[1]), first.dtype)
    torch.cat(list(tables), out=out)
    return out


# ---- FBGEMM's layout ----------------------------------------------------------------------------------------
def layout(indices: Sequence[Tensor], offsets: Sequence[Tensor], include_last_offset: bool = False
           ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(indices, offsets, shift, last) in FBGEMM's TBE layout: every table's indices concatenated; T*B+1 offsets,
    table-major, table t's shifted by the number of indices before it (`shift`, T+1 of them), then the total.
    `last` holds each table's last offset where include_last_offset (the layout drops it), else None.

    Four tensor ops do it: a cat of the indices, a cat (or stack) of the offsets, an add of the shifts, and the
    shifts' own tensor; a call with int32 indices and int64 offsets pays one conversion more."""
    tables = len(indices)
    idx = torch.cat(indices) if tables > 1 else indices[0].contiguous()
    starts = np.array([0, *accumulate(i.numel() for i in indices)], dtype=_NUMPY.get(idx.dtype, np.int64))
    shift = torch.from_numpy(starts)  # cheaper than torch.tensor(list) per call
    shift = shift if idx.device.type == "cpu" and shift.dtype == idx.dtype else shift.to(idx.device, idx.dtype)
    if include_last_offset:
        stacked = torch.stack(offsets)  # (T, B+1)
        bags = stacked.shape[1] - 1
        offs = torch.empty(tables * bags + 1, dtype=idx.dtype, device=idx.device)
        torch.add(stacked[:, :bags], shift[:-1, None], out=offs[:-1].view(tables, bags))
        offs[-1:].copy_(shift[-1:])
        return idx, offs, shift, stacked[:, -1]
    offs = torch.cat([*offsets, shift[-1:]])
    offs[:-1].view(tables, offsets[0].numel()).add_(shift[:-1, None])
    return idx, offs if offs.dtype == idx.dtype else offs.to(idx.dtype), shift, None


# ---- routing and the kernel call -----------------------------------------------------------------------------
def _index_dtype(indices: Sequence[Tensor]) -> str:
    """The index dtype the layout's cat gives (int64 if any table's indices are int64)."""
    first = indices[0].dtype
    if all(i.dtype is first for i in indices):
        return "int64" if first is torch.int64 else "int32" if first is torch.int32 else str(first)
    return "int64" if all(i.dtype in _INDEX_DTYPES for i in indices) else "mixed"


def fake(weight: Tensor, table_offsets: Tensor, indices: list[Tensor], offsets: list[Tensor], mode: str = "sum",
         include_last_offset: bool = False, validate: bool = True) -> Tensor:
    return weight.new_empty(offsets[0].shape[0] - int(include_last_offset), len(indices) * table_dim(weight),
                            dtype=out_dtype(weight))


def route(weight: Tensor, table_offsets: Tensor, indices: list[Tensor], offsets: list[Tensor], mode: str = "sum",
          include_last_offset: bool = False, validate: bool = True) -> Route | str:
    index = _index_dtype(indices)
    signature = (len(indices), table_dim(weight), mode, index, table_dtype(weight))
    bags = offsets[0].numel() - int(include_last_offset)
    nnz = sum(i.numel() for i in indices)
    if bags < 1 or nnz == 0:  # nothing to gather: not worth a kernel
        return Route(signature, 0)
    if signature[-1] is None:
        return f"kernels take float32, float16, bfloat16 or fused int8 tables, got {weight.dtype}"
    if index == "int32" and nnz >= 2**31:
        return f"{nnz} int32 indices overflow int32 offsets"
    if weight.device.type == "cuda" and weight.data_ptr() % 16:
        return "the GPU kernels need a 16-byte aligned weight (vector loads)"
    if weight.device.type == "cpu" and weight.data_ptr() % 64:  # e.g. a row view of a larger tensor
        return "the CPU kernels need a 64-byte aligned weight (TVM's buffers assume it for aligned vector loads)"
    return Route(signature, bags)


def run(chunks: Sequence[Any], weight: Tensor, table_offsets: Tensor, indices: list[Tensor], offsets: list[Tensor],
        mode: str = "sum", include_last_offset: bool = False, validate: bool = True) -> Tensor:
    idx, offs, shift, last = layout(indices, offsets, include_last_offset)
    if validate and weight.device.type != "cpu":
        check_data(weight, table_offsets, idx, offs, shift, last, indices, offsets, include_last_offset)
    elif validate and not _bag_edges_ok(offs, shift, last, (offs.numel() - 1) // len(indices)):
        _explain_bag_edges(indices, offsets, include_last_offset)
    return chunks[0].kernel(weight, table_offsets, idx, offs)


def compiled(w: Workload) -> tuple[Any, ...]:
    return (w.tables, w.dim, w.mode, w.index_dtype, w.dtype)


def describe(signature: tuple[Any, ...]) -> str:
    tables, dim, mode, index, dtype = signature
    return f"tables={tables} dim={dim} mode={mode} index={index} dtype={dtype}"


# ---- the calls a kernel must serve (autotune check) ---------------------------------------------------------
Case = tuple[str, tuple[Any, ...], dict[str, Any]]


def _tables(w: Workload, sizes: np.ndarray, seed: int, rows: Sequence[int] | None = None, last: bool = False,
            offsets_dtype: str | None = None, weights: dict[tuple[int, ...], Any] | None = None) -> list[Any]:
    """(weight, table_offsets, indices, offsets) of per-table bags of `sizes` (T, B) over w's tables (or `rows`);
    `weights` caches the concatenated tables by their rows (cases share them: MLPerf's tables are GBs)."""
    rows = tuple(w.rows if rows is None else rows)
    rng = np.random.default_rng(seed)
    idt, odt = getattr(torch, w.index_dtype), getattr(torch, offsets_dtype or w.index_dtype)
    indices = [torch.from_numpy(row_indices(r, int(s.sum()), w.distribution, w.zipf_exponent, rng)).to(idt)
               for r, s in zip(rows, sizes)]
    offsets = [torch.from_numpy(boundaries(s)[:len(s) + int(last)]).to(odt) for s in sizes]
    weights = {} if weights is None else weights
    if rows not in weights:
        weights[rows] = table(sum(rows), w.dim, w.dtype, seed)
    return [weights[rows], torch.from_numpy(boundaries(rows)), indices, offsets]


def _call(w: Workload, name: str, tensors: Sequence[Any], last: bool = False) -> Case:
    return name, tuple(tensors), {"mode": w.mode, "include_last_offset": last}


def cases(w: Workload, seed: int, count: int) -> Iterator[Case]:
    """The tuned batch, batches 1, one past it and above twice it, include_last_offset, empty bags (first, last,
    every third), every table's largest index and index 0, one bag far longer than the tuned pooling, other table
    sizes, and `count` random batches. Made one at a time as they are asked for, over tables of the workload's
    rows (and of 7 more) made once: a case list of its own tables each held MLPerf's 3.6 GB of float32 rows per
    case."""
    rng = np.random.default_rng(seed)
    hi, tables = max(1, w.pooling[1]), w.tables
    weights: dict[tuple[int, ...], Any] = {}

    def sizes(batch: int, lo: int = 1) -> np.ndarray:
        return rng.integers(lo, hi + 1, size=(tables, batch))

    def call(name: str, bags: np.ndarray, case_seed: int, last: bool = False, **kw: Any) -> Case:
        return _call(w, name, _tables(w, bags, case_seed, last=last, weights=weights, **kw), last)

    yield call(f"tuned batch {w.batch}", sizes(w.batch, w.pooling[0]), seed)
    for i, batch in enumerate(dict.fromkeys([1, w.batch + 1, 2 * w.batch + 3])):
        yield call(f"batch {batch}", sizes(batch), seed + 1 + i)
    yield call("include_last_offset", sizes(w.batch, w.pooling[0]), seed + 4, last=True)
    empty = sizes(max(w.batch, 4))
    empty[:, ::3] = 0
    empty[:, -1] = 0
    yield call("empty bags (first, last, every third)", empty, seed + 5)
    name, edge, kwargs = call("every table's largest index and index 0", sizes(w.batch), seed + 6)
    for i, r in zip(edge[2], w.rows):
        i[0], i[-1] = 0, r - 1
    yield name, edge, kwargs
    long = sizes(w.batch)
    long[:, 0] = 4 * hi + 1
    yield call(f"one bag of {4 * hi + 1} indices per table", long, seed + 7)
    yield call("tables of 7 rows more", sizes(w.batch), seed + 8, rows=[r + 7 for r in w.rows])
    if w.index_dtype == "int32":
        yield call("int64 offsets", sizes(w.batch), seed + 9, offsets_dtype="int64")
    pick = random.Random(seed)
    for i in range(count):
        batch = pick.randint(1, 2 * w.batch + 8)
        ragged = rng.integers(w.pooling[0], w.pooling[1] + 1, size=(tables, batch))
        ragged[:, pick.randrange(batch)] = hi  # at least one index: an all-empty call is PyTorch's by design
        yield call(f"random batch {batch} (seed {seed + 10 + i})", ragged, seed + 10 + i)


# ---- autograd: PyTorch's embedding_bag backward, once over the concatenated weight ----------------------------
def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    # (`inputs` shadows nothing it needs: it is the keyword torch passes the op's arguments by)
    weight, table_offsets, indices, offsets, mode, include_last_offset, _ = inputs
    ctx.save_for_backward(weight, table_offsets, *indices, *offsets)
    ctx.options = (len(indices), mode, include_last_offset)


def _backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    """One aten::_embedding_bag_backward over the concatenated weight: global rows (each table's indices plus its
    first row) and the layout's offsets, the output's (B, T*D) gradient reordered to the layout's table-major
    (T*B, D) bags. It recomputes the bag bookkeeping with aten::_embedding_bag (one PyTorch forward more)."""
    tables, mode, include_last_offset = ctx.options
    # one entry per argument the call passed (a compiled call may leave trailing defaults out), None per list item
    nones = (None, [None] * tables, [None] * tables) + (None,) * (len(ctx.needs_input_grad) - 4)
    if not ctx.needs_input_grad[0]:
        return (None, *nones)
    weight, table_offsets, *rest = ctx.saved_tensors
    if grad.numel() == 0:  # no bags: nothing pooled
        return (torch.zeros_like(weight), *nones)
    idx, offs, shift, _ = layout(rest[:tables], rest[tables:], include_last_offset)
    rows = idx.long() + torch.repeat_interleave(table_offsets[:-1], shift.diff(), output_size=idx.numel())
    offs, m, dim = offs.long(), ATEN_MODES[mode], weight.shape[1]
    _, offset2bag, bag_size, max_indices = torch.ops.aten._embedding_bag(
        weight.detach(), rows, offs, False, m, False, None, True, -1)
    bags = grad.reshape(grad.shape[0], tables, dim).transpose(0, 1).reshape(-1, dim)
    grad_weight = torch.ops.aten._embedding_bag_backward(
        bags, rows, offs, offset2bag, bag_size, max_indices, weight.shape[0], False, m, False, None, -1)
    return (grad_weight, *nones)


# ---- the drop-in module ----------------------------------------------------------------------------------------
class BatchedEmbeddingBag(nn.Module):
    """T embedding-bag tables in one module, as FBGEMM's TBE holds them: one `weight` Parameter of every table's
    rows (sum of rows, dim) and the `table_offsets` buffer (each table's first row, then the total).

    `forward(indices, offsets)` takes per-table lists, as T `nn.EmbeddingBag` would take them, and returns their
    outputs side by side, (B, T*dim), through `torch.ops.autotune.batched_embedding_bag` (one kernel call for
    all tables where a kernel is loaded). It trains: the op's backward gives the weight's gradient.
    `BatchedEmbeddingBag.quantized(module, dtype)` is an inference copy whose tables hold reduced-precision rows
    (embedding_bag's rows.py: "float16", "bfloat16" or "int8"), a buffer rather than a Parameter.
    """

    def __init__(self, rows: Sequence[int], dim: int, mode: str = "sum", include_last_offset: bool = False,
                 validate: bool = True, _weight: Optional[Tensor] = None):
        super().__init__()
        need(len(rows) >= 1 and all(r >= 1 for r in rows), OP, f"every table needs >= 1 rows, got {list(rows)}")
        need(mode in MODES, OP, f"mode must be one of {MODES}, got {mode!r}")
        self.rows, self.dim, self.mode = tuple(int(r) for r in rows), int(dim), mode
        self.include_last_offset, self.validate = include_last_offset, validate
        self.register_buffer("table_offsets", torch.from_numpy(boundaries(self.rows)))
        if _weight is None:
            _weight = torch.randn(sum(self.rows), self.dim)  # nn.EmbeddingBag's N(0, 1) initialisation
        reduced = table_dtype(_weight) not in (None, "float32")  # reduced-precision rows: for inference
        need(_weight.dim() == 2 and _weight.shape[0] == sum(self.rows) and table_dim(_weight) == self.dim, OP,
             f"_weight must hold {sum(self.rows)} rows of dim {self.dim}, got {_weight.dtype} of shape "
             f"{tuple(_weight.shape)}")
        if reduced:
            self.register_buffer("weight", _weight.detach().contiguous())
        else:
            self.weight = nn.Parameter(_weight)

    @classmethod
    def quantized(cls, module: "BatchedEmbeddingBag", dtype: str) -> "BatchedEmbeddingBag":
        """An inference copy of `module` with its tables converted once to `dtype` rows (float16, bfloat16, int8)."""
        need(dtype in ("float16", "bfloat16", "int8"), OP, f"dtype must be float16, bfloat16 or int8, got {dtype!r}")
        return cls(module.rows, module.dim, module.mode, module.include_last_offset, module.validate,
                   _weight=pages.in_huge_pages(quantize(module.weight, dtype)))

    @classmethod
    def from_modules(cls, bags: Sequence[nn.EmbeddingBag], validate: bool = True) -> "BatchedEmbeddingBag":
        """One module holding copies of these tables' weights, concatenated (one dim, mode and
        include_last_offset; no max_norm, padding_idx, sparse or frequency-scaled gradients)."""
        first = bags[0]
        for b in bags:
            same = (b.embedding_dim, b.mode, b.include_last_offset) == (
                first.embedding_dim, first.mode, first.include_last_offset)
            need(same, OP, "every table must have one embedding_dim, mode and include_last_offset")
            need(b.max_norm is None and b.padding_idx is None and not b.sparse and not b.scale_grad_by_freq, OP,
                 "tables with max_norm, padding_idx, sparse or scale_grad_by_freq are not batched")
        weight = concat_tables([b.weight.detach() for b in bags])
        return cls([b.num_embeddings for b in bags], first.embedding_dim, first.mode, first.include_last_offset,
                   validate, _weight=weight)

    def table(self, t: int) -> Tensor:
        """Table t's rows: a view of the weight."""
        return self.weight[sum(self.rows[:t]):sum(self.rows[:t + 1])]

    def forward(self, indices: Sequence[Tensor], offsets: Sequence[Tensor]) -> Tensor:
        return torch.ops.autotune.batched_embedding_bag(self.weight, self.table_offsets, list(indices),
                                                         list(offsets), self.mode, self.include_last_offset,
                                                         self.validate)

    def extra_repr(self) -> str:
        dtype = table_dtype(self.weight)
        return f"tables={len(self.rows)}, dim={self.dim}, mode={self.mode}, dtype={dtype}, autotune"


BINDING = TorchBinding(
    op=batched_embedding_bag, fake=fake, check=check, route=route, run=run, compiled=compiled,
    size=lambda w: w.batch, any_size=True, describe=describe, cases=cases, backward=_backward,
    setup_context=_setup_context, exports=(("BatchedEmbeddingBag", BatchedEmbeddingBag),))
