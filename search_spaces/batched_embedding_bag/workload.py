"""The table-batched embedding-bag workload (FBGEMM's TBE layout): fields and shape text, inputs in that
layout, PyTorch's semantics (one embedding_bag per table, then cat) and the checks that keep a kernel inside
its tensors. Pooling, distribution, Zipf rows, ragged bags and the tensor checks are embedding_bag's. No TVM.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..embedding_bag.workload import (bag_offsets, boundaries, check_index_tensors, check_monotone, check_table,
                                      check_tensors, error_flag, first_out_of_range, flag_error, flagged, gathered,
                                      forget_hot_rows, needs, normalise_bag_fields, pack, parse_pooling,
                                      float32_table, pool_dequantized, row_indices, table, timed_set_count,
                                      tolerance)
from ..embedding_bag.fbgemm import tbe
from ..embedding_bag.rows import RowFormat
from ..template import IndexOutOfRange, InvalidDtype, Traffic, Workload as _Workload, WorkloadError

__all__ = ["Workload", "after_call", "baselines", "check_data", "check_inputs", "inputs", "kernel_args", "pack",
           "parse_rows", "reference", "tolerance", "traffic"]


def parse_rows(raw: str) -> tuple[int, ...]:
    """`1000000x4+100000x8+1000` -> four tables of 1M rows, eight of 100k and one of 1000."""
    out: list[int] = []
    for group in raw.split("+"):
        rows, sep, count = group.strip().partition("x")
        try:
            n, k = int(rows), int(count) if sep else 1
        except ValueError:
            raise WorkloadError(f"rows={raw!r}: expected ROWS[xCOUNT][+ROWS[xCOUNT]...], e.g. 1000000x4+1000") from None
        if k < 1:
            raise WorkloadError(f"rows={raw!r}: a table count must be >= 1, got {k}")
        out += [n] * k
    return tuple(out)


@dataclass(frozen=True)
class Workload(_Workload):
    """One table-batched embedding-bag call.

    `rows` holds each table's row count (in table order); `tables` is their number. Shape text:
    `rows=1000000x4+100000x8+1000x14` is 4 tables of 1M rows, then 8 of 100k, then 14 of 1000 (`x COUNT` may
    be left out: `rows=50+7+300`); `tables=26,rows=100000` is 26 tables of 100k rows. `pooling` is the
    (min, max) number of indices per bag (`pooling=20-80`); `table_pooling`, where tables differ, each table's
    own (`table_pooling=3+2+1-4+100`: a count, or a range, per table, `x COUNT` repeating one), within
    `pooling` (its envelope): MLPerf DLRMv2's features pool 1 to 100 ids, one table a sample's heaviest, which
    decides how the work splits over cores. `distribution` is "uniform" or "zipf" (`dist=zipf:1.05`: row
    popularity ~ 1/rank**zipf_exponent within each table, hot rows scattered). `dtype` is how the tables store
    their rows, as embedding_bag's (rows.py).
    """

    rows: tuple[int, ...]
    dim: int
    batch: int
    pooling: tuple[int, int]
    tables: int = 0  # 0: as many as `rows` lists
    mode: str = "sum"
    index_dtype: str = "int64"
    distribution: str = "uniform"
    zipf_exponent: float = 1.05
    dtype: str = "float32"
    table_pooling: tuple[tuple[int, int], ...] = ()  # () : every table pools `pooling`

    SHAPE_ALIASES = {"index": "index_dtype", "dist": "distribution"}
    KEY_DEFAULTS = {"dtype": "float32", "table_pooling": ()}

    @property
    def rows_format(self) -> RowFormat:
        return RowFormat(self.dtype, self.dim)

    @classmethod
    def parse_rows(cls, raw: str) -> tuple[int, ...]:
        return parse_rows(raw)

    @classmethod
    def parse_pooling(cls, raw: str) -> tuple[int, int]:
        return parse_pooling(raw)

    @classmethod
    def parse_table_pooling(cls, raw: str) -> tuple[tuple[int, int], ...]:
        """`3+2+1-4+1x3` -> (3, 3), (2, 2), (1, 4), (1, 1), (1, 1), (1, 1)."""
        out: list[tuple[int, int]] = []
        for group in raw.split("+"):
            item, sep, count = group.strip().partition("x")
            try:
                out += [parse_pooling(item)] * (int(count) if sep else 1)
            except (ValueError, WorkloadError):
                raise WorkloadError(f"table_pooling={raw!r}: expected N or MIN-MAX per table, xCOUNT to repeat "
                                    "one, joined by + (3+2+1-4+1x3)") from None
        return tuple(out)

    def __post_init__(self) -> None:
        self._normalise_tables()
        normalise_bag_fields(self, ("dim", "batch"))
        self._normalise_table_pooling()
        if self.index_dtype == "int32" and self.tables * self.batch * self.pooling[1] >= 2**31:
            raise WorkloadError("int32 offsets address at most 2**31 indices (tables x batch x max pooling)")
        if self.index_dtype == "int32" and max(self.rows) >= 2**31:
            raise WorkloadError("int32 indices address at most 2**31 rows per table")

    def _normalise_tables(self) -> None:
        rows = self.rows
        rows = (rows,) if isinstance(rows, int) else tuple(rows)
        if not rows:
            raise WorkloadError("rows must name at least one table")
        if self.tables < 0:
            raise WorkloadError(f"tables must be >= 1, got {self.tables}")
        if self.tables and len(rows) != self.tables:
            if len(rows) != 1:
                raise WorkloadError(f"tables={self.tables} but rows lists {len(rows)} tables; give one row count "
                                    "for tables of one size, or a row count per table")
            rows = rows * self.tables
        if any(not isinstance(r, (int, np.integer)) or r < 1 for r in rows):
            raise WorkloadError(f"every table needs >= 1 rows, got {rows}")
        object.__setattr__(self, "rows", tuple(int(r) for r in rows))
        object.__setattr__(self, "tables", len(rows))

    def _normalise_table_pooling(self) -> None:
        if not self.table_pooling:
            object.__setattr__(self, "table_pooling", ())
            return
        try:
            ranges = tuple((int(lo), int(hi)) for lo, hi in self.table_pooling)
        except (TypeError, ValueError):
            raise WorkloadError(f"table_pooling must hold a (min, max) pair per table, got {self.table_pooling!r}"
                                ) from None
        if len(ranges) != self.tables:
            raise WorkloadError(f"table_pooling names {len(ranges)} tables, rows {self.tables}")
        if any(lo < 0 or hi < lo for lo, hi in ranges):
            raise WorkloadError(f"table_pooling: each range needs 0 <= min <= max, got {ranges}")
        envelope = (min(lo for lo, _ in ranges), max(hi for _, hi in ranges))
        if tuple(self.pooling) != envelope:
            raise WorkloadError(f"pooling={tuple(self.pooling)} must be table_pooling's envelope {envelope} "
                                f"(pooling={envelope[0]}-{envelope[1]})")
        object.__setattr__(self, "table_pooling", () if len(set(ranges)) == 1 else ranges)

    @property
    def total_rows(self) -> int:
        return sum(self.rows)

    def numeric_features(self) -> dict[str, float]:
        """A fixed-length summary of the tables (one feature per table would change length between shapes)."""
        rows = np.asarray(self.rows, dtype=np.float64)
        return {"tables": float(self.tables), "dim": float(self.dim), "batch": float(self.batch),
                "pooling.0": float(self.pooling[0]), "pooling.1": float(self.pooling[1]),
                "log2_total_rows": float(np.log2(rows.sum())), "log2_max_rows": float(np.log2(rows.max())),
                "log2_mean_rows": float(np.log2(rows.mean())), "zipf_exponent": float(
                    self.zipf_exponent if self.distribution == "zipf" else 0.0),
                "row_bytes": float(self.rows_format.row_bytes)}


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(weight, table_offsets, indices, offsets) as torch CPU tensors, in FBGEMM's TBE layout."""
    import torch

    weight = table(w.total_rows, w.dim, w.dtype, seed)
    ((indices, offsets),) = _batches(w, seed, np.random.default_rng(seed), 1)
    return weight, torch.from_numpy(boundaries(w.rows)), indices, offsets


def _batches(w: Workload, seed: int, rng: np.random.Generator, count: int) -> list[tuple[Any, Any]]:
    """(indices, offsets) of `count` calls drawn by `rng`, each table's hot rows by (seed, table). Table by table,
    so that each table's Zipf scatter is made once for all calls."""
    import torch

    drawn = [_bag_sizes(w, rng) for _ in range(count)]  # table-major bags
    per_table = [row_indices(rows, int(sum(sizes[t].sum() for sizes, _ in drawn)), w.distribution,
                             w.zipf_exponent, rng, hot_seed=(seed, t)) for t, rows in enumerate(w.rows)]
    forget_hot_rows()
    tdt = getattr(torch, w.index_dtype)
    taken = [0] * w.tables
    out = []
    for sizes, offsets in drawn:
        parts = []
        for t in range(w.tables):
            n = int(sizes[t].sum())
            parts.append(per_table[t][taken[t]:taken[t] + n])
            taken[t] += n
        indices = np.concatenate(parts).astype(np.int64)
        out.append((torch.from_numpy(indices).to(tdt), torch.from_numpy(offsets).to(tdt)))
    return out


def _bag_sizes(w: Workload, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(sizes (tables, batch), offsets) of one call's bags, each table's in its own pooling."""
    if not w.table_pooling:
        return bag_offsets(w.pooling, (w.tables, w.batch), rng)
    sizes = np.stack([bag_offsets(p, w.batch, rng)[0] for p in w.table_pooling])
    return sizes, boundaries(sizes.reshape(-1))


def timed_inputs(w: Workload, seed: int, tensors: tuple[Any, ...], cache_bytes: int) -> tuple[tuple[Any, ...], ...]:
    """The input sets timed calls cycle through: `tensors`, then batches of new bags on the same tables (as
    embedding_bag's `timed_inputs`, which says why)."""
    count = timed_set_count(traffic(w, *tensors).bytes, cache_bytes)
    more = _batches(w, seed, np.random.default_rng([seed, 1]), count - 1) if count > 1 else []
    return (tuple(tensors),) + tuple((tensors[0], tensors[1], *b) for b in more)


def _per_table(table_offsets: Any, indices: Any, offsets: Any, batch: int) -> list[tuple[int, int, Any, Any]]:
    """Each table's (first row, end row, its indices, its B+1 offsets rebased to 0)."""
    tables = table_offsets.numel() - 1
    rows = table_offsets.tolist()
    bounds = offsets[::batch].tolist()  # offsets[t * B] for t = 0..T
    out = []
    for t in range(tables):
        start, end = bounds[t], bounds[t + 1]
        local = offsets[t * batch:(t + 1) * batch + 1] - start
        out.append((rows[t], rows[t + 1], indices[start:end], local))
    return out


def _batch_of(w: Workload, offsets: Any) -> int:
    return (offsets.numel() - 1) // w.tables


def reference(w: Workload, weight: Any, table_offsets: Any, indices: Any, offsets: Any) -> Any:
    """PyTorch, one `embedding_bag` per table on its slice of the concatenated weight (its float32 values: rows.py),
    then `cat(dim=1)`."""
    import torch

    outs = [pool_dequantized(w.dtype, weight[r0:r1], idx, off, mode=w.mode, include_last_offset=True)
            for r0, r1, idx, off in _per_table(table_offsets, indices, offsets, _batch_of(w, offsets))]
    return torch.cat(outs, dim=1)


def baselines(w: Workload, weight: Any, table_offsets: Any, indices: Any, offsets: Any) -> dict[str, Callable[[], Any]]:
    """PyTorch's ways to do it, their inputs prepared outside the timing.

    `torch_per_table`: T `embedding_bag` calls (T launches) and a cat, as DLRM's reference model does.
    `torch_one_bag`: one `embedding_bag` over the concatenated weight with global row indices (one launch),
    then the (T, B, D) -> (B, T*D) transpose the output layout needs.
    Both pool float32 tables: reduced-precision tables are dequantized once (PyTorch's fp32 model is what a
    reduced-precision table is measured against). `fbgemm_tbe_<dtype>`: FBGEMM's TBE at the tables' precision,
    where fbgemm-gpu-cpu is installed (embedding_bag's fbgemm.py).
    """
    import torch
    import torch.nn.functional as F

    quantized = weight
    weight = float32_table(weight, w.dtype)
    batch = _batch_of(w, offsets)
    tables = _per_table(table_offsets, indices, offsets, batch)
    slices = [(weight[r0:r1], idx, off) for r0, r1, idx, off in tables]
    table_of = torch.repeat_interleave(torch.arange(w.tables, device=offsets.device),
                                       (offsets[batch::batch] - offsets[:-1:batch]).long())
    global_rows = indices.long() + table_offsets[table_of]
    global_offsets = offsets.long()

    def per_table() -> Any:
        return torch.cat([F.embedding_bag(i, t, o, mode=w.mode, include_last_offset=True)
                          for t, i, o in slices], dim=1)

    def one_bag() -> Any:
        pooled = F.embedding_bag(global_rows, weight, global_offsets, mode=w.mode, include_last_offset=True)
        return pooled.view(w.tables, batch, w.dim).transpose(0, 1).reshape(batch, w.tables * w.dim)

    calls = {"torch_per_table": per_table, "torch_one_bag": one_bag}
    fbgemm_tbe = tbe(w.dtype, _tables(quantized, tuple(table_offsets.tolist())), w.mode)
    if fbgemm_tbe is not None:
        idx, ends = indices.int(), offsets.int()
        calls[f"fbgemm_tbe_{w.dtype}"] = lambda: fbgemm_tbe(idx, ends)
    return calls


@functools.lru_cache(maxsize=1)
def _tables(weight: Any, bounds: tuple[int, ...]) -> list[Any]:
    """Each table's rows of the concatenated weight (views), the same objects for every batch of one weight (the
    TBE peer is built once per tables)."""
    return [weight[a:b] for a, b in zip(bounds, bounds[1:])]



_need = needs("batched_embedding_bag")


def check_inputs(w: Workload, weight: Any, table_offsets: Any, indices: Any, offsets: Any) -> None:
    """Raise a clear error for tensors that would make the kernel read out of bounds or compute garbage."""
    import torch

    check_tensors(_need, {"weight": weight, "table_offsets": table_offsets, "indices": indices, "offsets": offsets})
    check_table(_need, weight, w.rows_format, "sum of table rows")
    _need(table_offsets.dtype == torch.int64, f"table_offsets must be int64, got {table_offsets.dtype}", InvalidDtype)
    _need(table_offsets.shape == (w.tables + 1,),
          f"table_offsets must have tables + 1 = {w.tables + 1} entries, got {tuple(table_offsets.shape)}")
    check_index_tensors(_need, w.index_dtype, indices, offsets)
    _need(offsets.numel() > 1 and (offsets.numel() - 1) % w.tables == 0,
          f"offsets must have tables x batch + 1 entries (tables = {w.tables}), got {offsets.numel()}")
    check_data(w, weight, table_offsets, indices, offsets)


def check_data(w: Workload, weight: Any, table_offsets: Any, indices: Any, offsets: Any) -> None:
    """The checks of the data (what the kernels check themselves as they gather): table offsets from 0 to the
    weight's rows, offsets from 0, non-decreasing, within the indices, and every index a row of its table."""
    check_monotone(_need, "table_offsets", table_offsets, weight.shape[0], "the weight's rows")
    _need(int(table_offsets[-1]) == weight.shape[0],
          f"table_offsets[-1] = {int(table_offsets[-1])} must equal the weight's {weight.shape[0]} rows")
    check_monotone(_need, "offsets", offsets, indices.numel(), "indices")
    _check_index_range(table_offsets, indices, offsets, _batch_of(w, offsets))


def _check_index_range(table_offsets: Any, indices: Any, offsets: Any, batch: int) -> None:
    """Every index must be a row of its own table: 0 <= index < rows of table t."""
    import torch

    nnz = int(offsets[-1])
    if nnz == 0:
        return
    per_table = (offsets[batch::batch] - offsets[:-1:batch]).long()
    table_of = torch.repeat_interleave(torch.arange(per_table.numel(), device=indices.device), per_table)
    used = indices[:nnz].long()
    rows = (table_offsets[1:] - table_offsets[:-1])[table_of]
    k = first_out_of_range(used, rows)
    if k is not None:
        _need(False, f"index {int(used[k])} at position {k} is out of range for table {int(table_of[k])}, which "
              f"has {int(rows[k])} rows (indices are local to their table: [0, rows))", IndexOutOfRange)


def kernel_args(w: Workload, cfg: Any, packed: Sequence[Any], weight: Any, table_offsets: Any, indices: Any,
                offsets: Any) -> tuple[Sequence[Any], Any]:
    """The tables are read in place (no packed weights): arguments are the inputs plus a new output, and the
    error flag (embedding_bag's error_flag)."""
    import torch

    out = torch.empty(_batch_of(w, offsets), w.tables * w.dim, dtype=torch.float32, device=weight.device)
    return [weight, table_offsets, indices, offsets, out, error_flag(weight)], out


def after_call(w: Workload, args: Sequence[Any], out: Any) -> None:
    """Raise what the kernel flagged (CPU only: see embedding_bag's error_flag), the message found by checking
    the inputs again: a pass over them, but only once a call has failed."""
    code = flagged(args[-1])
    if code:
        weight, table_offsets, indices, offsets = args[:4]
        if offsets.numel() > 1 and (offsets.numel() - 1) % w.tables == 0:
            check_data(w, weight, table_offsets, indices, offsets)
        raise flag_error(code, "batched_embedding_bag")


def traffic(w: Workload, weight: Any, table_offsets: Any, indices: Any, offsets: Any) -> Traffic:
    return gathered(int(offsets[-1]), w.dim, w.rows_format.row_bytes)
