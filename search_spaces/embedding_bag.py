"""Embedding-bag: ragged gathers of table rows, pooled per bag (torch.nn.functional.embedding_bag).

The kernel is written in TVMScript because bags are ragged: each bag is an opaque block whose inner reduction
runs over `offsets[b]..offsets[b+1]`, a data-dependent extent TE cannot schedule well. Batch, number of
indices and table rows are symbolic, so one compiled kernel serves any batch; the embedding dimension, mode,
index dtype and options are compiled in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .space import Choice, Config, Constraint, InvalidConfig, Space
from .template import Traffic, Workload as _Workload, WorkloadError

NAME = "embedding_bag"
DOC = "torch.nn.functional.embedding_bag: ragged bags (offsets), sum/mean/max, per-sample weights, padding_idx"

EXAMPLE_SHAPE = "rows=1000000,dim=64,batch=2048,pooling=20-80,dist=zipf:1.05"

WEIGHTS: tuple[int, ...] = ()  # nothing to pack: rows are gathered from the table as it is

MODES = ("sum", "mean", "max")
INDEX_DTYPES = ("int64", "int32")


@dataclass(frozen=True)
class Workload(_Workload):
    """One embedding-bag call: table shape, batch, bag sizes, index distribution and options.

    `pooling` is the (min, max) number of indices per bag; bag sizes are drawn uniformly in that range.
    `distribution` is "uniform" or "zipf" (row popularity ~ 1/rank**zipf_exponent, hot rows scattered),
    because real recommendation traffic is skewed and cache behaviour depends on it.
    """

    rows: int
    dim: int
    batch: int
    pooling: tuple[int, int]
    mode: str = "sum"
    index_dtype: str = "int64"
    per_sample_weights: bool = False
    padding_idx: int | None = None
    include_last_offset: bool = False
    distribution: str = "uniform"
    zipf_exponent: float = 1.05

    SHAPE_ALIASES = {"index": "index_dtype", "weighted": "per_sample_weights", "dist": "distribution"}

    @classmethod
    def parse_pooling(cls, raw: str) -> tuple[int, int]:
        lo, sep, hi = raw.partition("-")
        try:
            return (int(lo), int(hi)) if sep else (int(lo), int(lo))
        except ValueError:
            raise WorkloadError(f"pooling={raw!r}: expected N or MIN-MAX indices per bag") from None

    def __post_init__(self) -> None:
        if self.distribution.startswith("zipf:"):
            try:
                exponent = float(self.distribution.split(":", 1)[1])
            except ValueError:
                raise WorkloadError(f"dist={self.distribution!r}: expected zipf:EXPONENT") from None
            object.__setattr__(self, "distribution", "zipf")
            object.__setattr__(self, "zipf_exponent", exponent)
        if isinstance(self.pooling, int):
            object.__setattr__(self, "pooling", (self.pooling, self.pooling))
        for name in ("rows", "dim", "batch"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"{name} must be >= 1, got {getattr(self, name)}")
        lo, hi = self.pooling
        if not 0 <= lo <= hi:
            raise WorkloadError(f"pooling must be 0 <= min <= max, got {lo}-{hi}")
        if self.mode not in MODES:
            raise WorkloadError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.index_dtype not in INDEX_DTYPES:
            raise WorkloadError(f"index dtype must be one of {INDEX_DTYPES}, got {self.index_dtype!r}")
        if self.per_sample_weights and self.mode != "sum":
            raise WorkloadError("per_sample_weights is only supported with mode=sum (as in PyTorch)")
        if self.padding_idx is not None:
            pad = self.padding_idx + self.rows if self.padding_idx < 0 else self.padding_idx
            if not 0 <= pad < self.rows:
                raise WorkloadError(f"padding_idx {self.padding_idx} is out of range for {self.rows} rows")
            object.__setattr__(self, "padding_idx", pad)
        if self.distribution not in ("uniform", "zipf"):
            raise WorkloadError(f"distribution must be uniform or zipf[:EXPONENT], got {self.distribution!r}")
        if self.distribution == "zipf" and self.zipf_exponent <= 0:
            raise WorkloadError(f"zipf exponent must be > 0, got {self.zipf_exponent}")
        if self.index_dtype == "int32" and self.rows * self.dim >= 2**31:
            raise WorkloadError("int32 indices address at most 2**31 table elements")


# ---- knobs --------------------------------------------------------------------------------------------
THREADING = Choice("threading", ("parallel", "serial"), doc=(
    "Bags are independent, so they spread over cores; but on a small or busy machine the launch and "
    "imbalance of a parallel region can cost more than a second core's memory parallelism brings."))
BAGS_PER_TASK = Choice("bags_per_task", (8, 1, 2, 4, 16, 32, 64), doc=(
    "Bags one parallel task pools in a row: small tasks balance ragged bags across threads, large ones "
    "amortise scheduling and keep a thread's output rows contiguous."))
VECTOR = Choice("vector", (8, 4, 16, 1), doc=(
    "SIMD lanes over the embedding dimension (8 fp32 = one AVX2 register); wider unrolls register use, "
    "narrower suits small dims. Must divide the dimension."))
DIM_TILES = Choice("dim_tiles", (1, 2, 4, 8), doc=(
    "Splits the dimension into tiles: fewer accumulators live at once (register pressure at dim 128+), "
    "at the cost of walking the bag's indices once per tile when tiles are the outer loop."))
LOOP_ORDER = Choice("loop_order", ("rows_outer", "tiles_outer"), doc=(
    "rows_outer reads each gathered row once, all tiles of it together; tiles_outer re-walks the bag per "
    "dimension tile, keeping a tile's accumulators in registers for long bags."))
UNROLL = Choice("unroll", (1, 2, 4, 8), doc=(
    "Unrolls the pooling loop so several independent row loads are in flight: random-row gathers are "
    "latency-bound, and overlapping misses is most of the speed."))
PREFETCH = Choice("prefetch", (0, 4, 8, 16, 32), doc=(
    "Software-prefetch distance in rows (LLVM's prefetch intrinsic), as FBGEMM's generated kernels do: "
    "issues the miss for the row that many indices ahead, across bag boundaries. 0 disables it."))
PREFETCH_LINES = Choice("prefetch_lines", (1, 2, 4, 8), doc=(
    "64-byte cache lines of the future row to prefetch: a whole row costs more prefetch slots, a partial "
    "one relies on the hardware's adjacent-line prefetcher."))
ACCUMULATOR = Choice("accumulator", ("output", "local"), doc=(
    "Accumulate into the output row directly, or into a local buffer written back once per bag "
    "(lets LLVM keep partial sums in registers when it cannot prove the output does not alias)."))


def space(w: Workload, target: Any) -> Space:
    """The CPU schedule space of this workload (GPU spaces arrive with the CUDA schedules)."""
    if target.kind.name != "llvm":
        raise InvalidConfig(f"embedding_bag has no schedule for target kind {target.kind.name!r} yet")
    vectors = [v for v in VECTOR.options if w.dim % v == 0]
    tiles = [t for t in DIM_TILES.options if any((w.dim // v) % t == 0 for v in vectors)]
    lines = [n for n in PREFETCH_LINES.options if n == 1 or n * 16 <= w.dim]
    return Space(
        [THREADING, BAGS_PER_TASK, VECTOR.only(vectors), DIM_TILES.only(tiles), LOOP_ORDER, UNROLL,
         PREFETCH, PREFETCH_LINES.only(lines), ACCUMULATOR],
        [
            Constraint("dim_tiles must divide dim / vector",
                       lambda c: (w.dim // c[VECTOR]) % c[DIM_TILES] == 0),
            Constraint("tiles_outer needs more than one tile and no prefetch (the prefetch sits in the row loop)",
                       lambda c: c[LOOP_ORDER] == "rows_outer" or (c[DIM_TILES] > 1 and c[PREFETCH] == 0)),
            Constraint("prefetch_lines only matters with prefetch on",
                       lambda c: c[PREFETCH] > 0 or c[PREFETCH_LINES] == 1),
            Constraint("bags_per_task only matters for parallel threading",
                       lambda c: c[THREADING] == "parallel" or c[BAGS_PER_TASK] == BAGS_PER_TASK.options[0]),
        ],
    )


# ---- the computation ------------------------------------------------------------------------------------
def compute(w: Workload, prefetch: int = 0, prefetch_lines: int = 1) -> Any:
    """The ragged embedding bag as TVMScript. `prefetch` rows ahead are prefetched (0: none)."""
    import tvm
    from tvm.script import tirx as T

    D, idt, mode = w.dim, w.index_dtype, w.mode
    weighted = w.per_sample_weights
    has_pad = w.padding_idx is not None
    pad = w.padding_idx if has_pad else -1
    needs_count = mode in ("mean", "max")
    ilo = w.include_last_offset
    extra = 1 if ilo else 0
    line_floats = 16
    identity = -math.inf if mode == "max" else 0.0

    def end_of(Off: Any, vb: Any, NB: Any, NNZ: Any) -> Any:
        # With include_last_offset the offsets carry the end of the last bag; otherwise it is len(indices).
        if ilo:
            return T.Cast("int64", Off[vb + 1])
        return T.if_then_else(vb + 1 < NB, T.Cast("int64", Off[T.min(vb + 1, NB - 1)]), NNZ)

    def row_of(I: Any, Off: Any, vb: Any, vl: Any) -> Any:
        return T.Cast("int64", I[T.Cast("int64", Off[vb]) + vl])

    def combine(acc: Any, value: Any) -> Any:
        return T.max(acc, value) if mode == "max" else acc + value

    @T.macro
    def pool(W, I, Off, PSW, A, vb, NB, NNZ):
        """Reduce the bag's rows into A[vb, :] (the output for sum, a per-bag scratch for mean/max)."""
        for l in range(end_of(Off, vb, NB, NNZ) - T.Cast("int64", Off[vb])):
            if prefetch > 0:
                with T.sblock("prefetch"):
                    T.reads()
                    T.writes()
                    # clamped, not guarded: no branch in the loop; the tail re-prefetches the last row
                    for c in T.unroll(prefetch_lines):
                        T.evaluate(T.call_llvm_intrin(
                            "void", "llvm.prefetch.p0", T.address_of(W[T.Cast("int64", I[T.min(
                                T.Cast("int64", Off[vb]) + l + prefetch, NNZ - 1)]), c * line_floats]),
                            0, 3, 1))
            for d in range(D):
                with T.sblock("acc"):
                    vl = T.axis.reduce(end_of(Off, vb, NB, NNZ) - T.Cast("int64", Off[vb]), l)
                    vd = T.axis.spatial(D, d)
                    with T.init():
                        A[vb, vd] = T.float32(identity)
                    if weighted:
                        A[vb, vd] = combine(A[vb, vd], W[row_of(I, Off, vb, vl), vd]
                                            * PSW[T.Cast("int64", Off[vb]) + vl])
                    elif has_pad:
                        A[vb, vd] = combine(A[vb, vd], T.if_then_else(
                            row_of(I, Off, vb, vl) == pad, T.float32(identity), W[row_of(I, Off, vb, vl), vd]))
                    else:
                        A[vb, vd] = combine(A[vb, vd], W[row_of(I, Off, vb, vl), vd])

    @T.macro
    def body(W, I, Off, PSW, O, NB, NNZ):
        for b in range(NB):
            with T.sblock("bag"):
                vb = T.axis.spatial(NB, b)
                if weighted:
                    T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:D], PSW[0:NNZ])
                else:
                    T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:D])
                T.writes(O[vb, 0:D])
                if needs_count:
                    A = T.sblock_alloc_buffer((NB, D), "float32", scope="local")
                    cnt = T.sblock_alloc_buffer((1,), "float32", scope="local")
                    pool(W, I, Off, PSW, A, vb, NB, NNZ)
                    with T.sblock("count"):
                        T.reads(Off[vb:vb + 2], I[0:NNZ])
                        T.writes(cnt[0])
                        cnt[0] = T.Cast("float32", end_of(Off, vb, NB, NNZ) - T.Cast("int64", Off[vb]))
                        if has_pad:
                            for l2 in range(end_of(Off, vb, NB, NNZ) - T.Cast("int64", Off[vb])):
                                if I[T.Cast("int64", Off[vb]) + l2] == pad:
                                    cnt[0] = cnt[0] - T.float32(1)
                    for d2 in range(D):
                        with T.sblock("finalize"):
                            vd2 = T.axis.spatial(D, d2)
                            if mode == "mean":
                                O[vb, vd2] = A[vb, vd2] / T.max(cnt[0], T.float32(1))
                            else:
                                O[vb, vd2] = T.if_then_else(cnt[0] == T.float32(0), T.float32(0), A[vb, vd2])
                else:
                    pool(W, I, Off, PSW, O, vb, NB, NNZ)

    if weighted:
        @T.prim_func(s_tir=True)
        def main(w_: T.handle, ind: T.handle, off: T.handle, psw: T.handle, out: T.handle):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            R = T.int64()
            NNZ = T.int64()
            NB = T.int64()
            W = T.match_buffer(w_, (R, D), "float32")
            I = T.match_buffer(ind, (NNZ,), idt)
            Off = T.match_buffer(off, (NB + extra,), idt)
            PSW = T.match_buffer(psw, (NNZ,), "float32")
            O = T.match_buffer(out, (NB, D), "float32")
            body(W, I, Off, PSW, O, NB, NNZ)
    else:
        @T.prim_func(s_tir=True)
        def main(w_: T.handle, ind: T.handle, off: T.handle, out: T.handle):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            R = T.int64()
            NNZ = T.int64()
            NB = T.int64()
            W = T.match_buffer(w_, (R, D), "float32")
            I = T.match_buffer(ind, (NNZ,), idt)
            Off = T.match_buffer(off, (NB + extra,), idt)
            O = T.match_buffer(out, (NB, D), "float32")
            body(W, I, Off, W, O, NB, NNZ)  # PSW unused: the table stands in so the macro type-checks

    return tvm.IRModule({"main": main})


def schedule(sch: Any, w: Workload, cfg: Config, target: Any) -> None:
    """Apply a CPU config to the schedule of `compute(w, cfg[PREFETCH], cfg[PREFETCH_LINES])`."""
    vec, tiles = cfg[VECTOR], cfg[DIM_TILES]
    if w.dim % (vec * tiles):
        raise InvalidConfig(f"vector {vec} x dim_tiles {tiles} does not divide dim {w.dim}")
    (b,) = sch.get_loops(sch.get_sblock("bag"))
    if cfg[THREADING] == "parallel":
        bo, _ = sch.split(b, [None, cfg[BAGS_PER_TASK]])
        sch.parallel(bo)

    acc = sch.get_sblock("acc")
    if cfg[ACCUMULATOR] == "local":
        write_back = sch.cache_write(acc, 0, "local")
        *_, wd = sch.get_loops(write_back)
        _, wv = sch.split(wd, [None, vec])
        sch.vectorize(wv)
    l, d = sch.get_loops(acc)
    dt, dm, dv = sch.split(d, [tiles, None, vec])
    if cfg[LOOP_ORDER] == "tiles_outer":
        sch.reorder(dt, l)
    if vec > 1:
        sch.vectorize(dv)
    sch.unroll(dm)
    sch.decompose_reduction(acc, l)
    if cfg[UNROLL] > 1:
        _, li = sch.split(l, [None, cfg[UNROLL]])
        sch.unroll(li)
    if w.mode in ("mean", "max") and vec > 1:
        (fd,) = sch.get_loops(sch.get_sblock("finalize"))
        _, fv = sch.split(fd, [None, vec])
        sch.vectorize(fv)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The scheduled IRModule for one config: what `tvm.compile` builds."""
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, cfg[PREFETCH], cfg[PREFETCH_LINES]))
    schedule(sch, w, cfg, target)
    return sch.mod


# ---- data, reference, validation ---------------------------------------------------------------------
def _bag_sizes(w: Workload, rng: np.random.Generator) -> np.ndarray:
    lo, hi = w.pooling
    return rng.integers(lo, hi + 1, size=w.batch)


def _indices(w: Workload, n: int, rng: np.random.Generator) -> np.ndarray:
    if w.distribution == "uniform":
        return rng.integers(0, w.rows, size=n)
    # Zipf over ranks 1..rows via the inverse CDF, then scattered by a fixed permutation of rows
    ranks = np.arange(1, w.rows + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -w.zipf_exponent)
    cdf /= cdf[-1]
    hot = np.searchsorted(cdf, rng.random(n), side="right")
    return rng.permutation(w.rows)[np.minimum(hot, w.rows - 1)]


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(weight, indices, offsets[, per_sample_weights]) as torch CPU tensors, in the reference's order."""
    import torch

    rng = np.random.default_rng(seed)
    sizes = _bag_sizes(w, rng)
    nnz = int(sizes.sum())
    offsets = np.zeros(w.batch + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if not w.include_last_offset:
        offsets = offsets[:-1]
    indices = _indices(w, nnz, rng)
    if w.padding_idx is not None and nnz:
        indices[rng.random(nnz) < 0.1] = w.padding_idx  # some padding to exercise the exclusion
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(w.rows, w.dim, generator=gen)
    tdt = getattr(torch, w.index_dtype)
    out = [weight, torch.from_numpy(indices).to(tdt), torch.from_numpy(offsets).to(tdt)]
    if w.per_sample_weights:
        out.append(torch.rand(nnz, generator=gen))
    return tuple(out)


def reference(w: Workload, weight: Any, indices: Any, offsets: Any, per_sample_weights: Any = None) -> Any:
    import torch

    return torch.nn.functional.embedding_bag(
        indices, weight, offsets, mode=w.mode, per_sample_weights=per_sample_weights,
        include_last_offset=w.include_last_offset, padding_idx=w.padding_idx)


def check_inputs(w: Workload, weight: Any, indices: Any, offsets: Any, per_sample_weights: Any = None) -> None:
    """Raise a clear error for tensors that would make the kernel read out of bounds or compute garbage."""
    import torch

    def need(cond: bool, msg: str, exc: type[Exception] = ValueError) -> None:
        if not cond:
            raise exc(f"embedding_bag: {msg}")

    tensors = {"weight": weight, "indices": indices, "offsets": offsets}
    if per_sample_weights is not None:
        tensors["per_sample_weights"] = per_sample_weights
    for name, t in tensors.items():
        need(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}", TypeError)
        need(t.device.type == "cpu", f"{name} is on {t.device}, this kernel runs on cpu")
        need(t.is_contiguous(), f"{name} must be contiguous")
    need(weight.dtype == torch.float32, f"weight must be float32, got {weight.dtype}", TypeError)
    need(weight.dim() == 2 and weight.shape[1] == w.dim,
         f"weight must be (rows, {w.dim}), got {tuple(weight.shape)}")
    idt = getattr(torch, w.index_dtype)
    need(indices.dtype == idt and offsets.dtype == idt,
         f"indices and offsets must be {w.index_dtype}, got {indices.dtype} and {offsets.dtype}", TypeError)
    need(indices.dim() == 1 and offsets.dim() == 1, "indices and offsets must be 1-D")
    need(offsets.numel() >= 1 + int(w.include_last_offset), "offsets is too short for one bag")
    if w.per_sample_weights:
        need(per_sample_weights is not None, "this kernel was tuned with per_sample_weights; pass them")
        need(per_sample_weights.dtype == torch.float32, "per_sample_weights must be float32", TypeError)
        need(per_sample_weights.shape == indices.shape, "per_sample_weights must have the shape of indices")
    else:
        need(per_sample_weights is None, "this kernel was tuned without per_sample_weights")
    n = indices.numel()
    if n:
        lo, hi = int(indices.min()), int(indices.max())
        need(0 <= lo and hi < weight.shape[0],
             f"indices must be in [0, {weight.shape[0]}), got values in [{lo}, {hi}]", IndexError)
    need(int(offsets[0]) == 0, f"offsets[0] must be 0, got {int(offsets[0])}")
    steps = offsets[1:] - offsets[:-1]
    need(bool((steps >= 0).all()), "offsets must be non-decreasing")
    need(int(offsets[-1]) <= n, f"offsets[-1] = {int(offsets[-1])} exceeds the {n} indices")


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], weight: Any, indices: Any, offsets: Any,
                per_sample_weights: Any = None) -> tuple[Sequence[Any], Any]:
    """The table is read in place (no packed weights): arguments are the inputs plus a new output."""
    import torch

    bags = offsets.numel() - (1 if w.include_last_offset else 0)
    out = torch.empty(bags, w.dim, dtype=torch.float32)
    args = [weight, indices, offsets] + ([per_sample_weights] if w.per_sample_weights else []) + [out]
    return args, out


def traffic(w: Workload, weight: Any, indices: Any, offsets: Any, per_sample_weights: Any = None) -> Traffic:
    """Gathered bytes: every pooled index reads one table row (the figure FBGEMM and papers report)."""
    nnz = int(offsets[-1]) if w.include_last_offset else indices.numel()
    row_bytes = w.dim * 4
    return Traffic(bytes=float(nnz * row_bytes), ops=float(nnz * w.dim), unit="GB/s")


def tolerance(w: Workload) -> tuple[float, float]:
    return (1e-4, 1e-4 * max(1, w.pooling[1]))
