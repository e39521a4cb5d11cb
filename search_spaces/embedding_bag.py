"""Embedding-bag: ragged gathers of table rows, pooled per bag (torch.nn.functional.embedding_bag).

The kernel is written in TVMScript because bags are ragged: each bag is an opaque block whose inner reduction
runs over `offsets[b]..offsets[b+1]`, a data-dependent extent TE cannot schedule well. Batch, number of
indices and table rows are symbolic, so one compiled kernel serves any batch; the embedding dimension, mode,
index dtype and options are compiled in.

CPU (llvm) and CUDA have their own knobs and TVMScript (`compute`, `compute_gpu`): the CPU kernel prefetches
rows with LLVM's intrinsic; the CUDA one maps a bag to a group of threads along the dimension (16-byte vector
loads, several bags per warp or block), gathers an unrolled step of rows at once to keep loads in flight, and
shares index loads across the group with warp shuffles. `lower_gpu_emulation` builds a CUDA config's schedule
for the CPU, so its numerics can be checked without a GPU.
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


def parse_pooling(raw: str) -> tuple[int, int]:
    """`20-80` -> (20, 80); `20` -> (20, 20): indices per bag."""
    lo, sep, hi = raw.partition("-")
    try:
        return (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError:
        raise WorkloadError(f"pooling={raw!r}: expected N or MIN-MAX indices per bag") from None


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
        return parse_pooling(raw)

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


# ---- knobs: CUDA --------------------------------------------------------------------------------------
GPU_VECTOR = Choice("gpu_vector", (4, 2, 1), doc=(
    "fp32 lanes one thread loads at once: 4 is a 16-byte float4 load, the widest a thread can issue, so a "
    "32-thread group reads 512 contiguous bytes of a row per instruction. Must divide the dimension."))
DIM_THREADS = Choice("dim_threads", (32, 16, 8, 4, 2, 1, 64, 128, 256), doc=(
    "Threads that pool one bag, side by side along the dimension (each owns dim / (dim_threads * "
    "gpu_vector) vectors of every row, interleaved so a group's loads are contiguous). Fewer threads than a "
    "warp put warp_size / dim_threads bags in each warp and give each thread more independent loads; more "
    "than a warp split wide rows over warps."))
THREADS = Choice("threads", (128, 256, 64, 512, 1024, 32), doc=(
    "Threads per block: threads / dim_threads bags share a block. Small blocks spread ragged bags evenly "
    "over the SMs; large ones amortise block scheduling. Capped by the target's max threads per block."))
GPU_UNROLL = Choice("gpu_unroll", (8, 4, 2, 1, 16), doc=(
    "Rows of a bag gathered per unrolled step: a random-row gather is latency-bound, so each thread keeps "
    "this many independent row loads in flight (Little's law: bandwidth x latency bytes must be in flight "
    "per SM); more costs registers."))
INDEX_PREFETCH = Choice("index_prefetch", ("shuffle", "none"), doc=(
    "shuffle: a bag's group of threads reads the next indices (and per-sample weights) together, one per "
    "lane in a single coalesced load, ahead of the gather, then broadcasts each with a warp shuffle (as "
    "FBGEMM's kernels do): one index load instruction per lane per chunk instead of one per row per thread. "
    "none: every thread reads each index itself (a broadcast load from L1)."))
GPU_MAX_ACCUMULATORS = 64  # fp32 partial sums a thread keeps in registers: beyond this they spill
GPU_MAX_IN_FLIGHT = 64  # fp32 values of one unrolled step's loads a thread holds at once, likewise


def space(w: Workload, target: Any) -> Space:
    """The schedule space of this workload on the target: CPU (llvm) or CUDA."""
    if _is_gpu(target):
        return _gpu_space(w, target)
    if target.kind.name != "llvm":
        raise InvalidConfig(f"embedding_bag has no schedule for target kind {target.kind.name!r}")
    return _cpu_space(w)


def _is_gpu(target: Any) -> bool:
    return target.kind.name == "cuda"


def _cpu_space(w: Workload) -> Space:
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


def _gpu_space(w: Workload, target: Any) -> Space:
    """The CUDA space: vector width and threads per bag along the dimension, block size, unroll, indices."""
    max_threads = int(target.attrs["max_threads_per_block"])
    warp = int(target.attrs["thread_warp_size"])
    vectors = [v for v in GPU_VECTOR.options if w.dim % v == 0]
    lanes = [t for t in DIM_THREADS.options if t <= max_threads and any((w.dim // v) % t == 0 for v in vectors)]
    threads = [t for t in THREADS.options if t <= max_threads and t % warp == 0]
    if not threads:
        raise InvalidConfig(f"no block size of {THREADS.options} fits {max_threads} threads per block "
                            f"in whole warps of {warp}")
    return Space(
        [GPU_VECTOR.only(vectors), DIM_THREADS.only(lanes), THREADS.only(threads), GPU_UNROLL, INDEX_PREFETCH],
        [
            Constraint("dim_threads * gpu_vector must divide dim",
                       lambda c: w.dim % (c[DIM_THREADS] * c[GPU_VECTOR]) == 0),
            Constraint(f"a thread accumulates at most {GPU_MAX_ACCUMULATORS} floats (registers, no spills)",
                       lambda c: w.dim // c[DIM_THREADS] <= GPU_MAX_ACCUMULATORS),
            Constraint(f"a step's loads hold at most {GPU_MAX_IN_FLIGHT} floats per thread (registers)",
                       lambda c: c[GPU_UNROLL] * (w.dim // c[DIM_THREADS]) <= GPU_MAX_IN_FLIGHT),
            Constraint(f"threads per block <= {max_threads} and a block holds whole bags",
                       lambda c: c[DIM_THREADS] <= c[THREADS] <= max_threads and c[THREADS] % c[DIM_THREADS] == 0),
        ],
    )


# ---- the computation ------------------------------------------------------------------------------------
def compute(w: Workload, prefetch: int = 0, prefetch_lines: int = 1) -> Any:
    """The ragged embedding bag as TVMScript. `prefetch` rows ahead are prefetched (0: none)."""
    from tvm.script import tirx as T

    D, idt, mode = w.dim, w.index_dtype, w.mode
    weighted = w.per_sample_weights
    has_pad = w.padding_idx is not None
    pad = w.padding_idx if has_pad else -1
    needs_count = mode in ("mean", "max")
    ilo = w.include_last_offset
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
                    if weighted and has_pad:  # padded entries are excluded, whatever their weight
                        A[vb, vd] = combine(A[vb, vd], T.if_then_else(
                            row_of(I, Off, vb, vl) == pad, T.float32(identity),
                            W[row_of(I, Off, vb, vl), vd] * PSW[T.Cast("int64", Off[vb]) + vl]))
                    elif weighted:
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

    return _module(w, body)


def _module(w: Workload, body: Any) -> Any:
    """The kernel's signature around a `body(W, I, Off, PSW, O, NB, NNZ)` macro: rows, indices and batch are
    symbolic; per-sample weights are an argument only when the workload has them."""
    import tvm
    from tvm.script import tirx as T

    D, idt = w.dim, w.index_dtype
    extra = 1 if w.include_last_offset else 0
    if w.per_sample_weights:
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


def compute_gpu(w: Workload, vec: int, dim_threads: int, unroll: int, shuffle: int = 0, warp: int = 32,
                emulate: bool = False) -> Any:
    """The ragged embedding bag as TVMScript shaped for CUDA (no LLVM intrinsics; same options as `compute`).

    A "bag" block instance is one thread of a bag's group of `dim_threads`: it owns the `vec`-wide vectors
    `k * dim_threads + t` of every row (interleaved, so the group's loads of a row are contiguous) and pools
    them in registers. The bag's rows are walked in steps of `unroll` rows (the schedule unrolls a step): the
    step's row indices, then its loads (unconditional: past the bag's end they read row 0), then the masked
    adds. With `shuffle` lanes (0: off), each chunk of max(unroll, shuffle) indices (and per-sample weights)
    is first read by the group together, one per lane, and each is broadcast from its lane by a warp shuffle
    restricted to the group's lanes. `emulate` swaps the shuffle for the read it broadcasts (CPU twin).
    """
    from tvm.script import tirx as T

    D, idt, mode = w.dim, w.index_dtype, w.mode
    G, U = dim_threads, unroll
    P = max(U, shuffle)  # rows per chunk: whole unrolled steps and, with shuffles, whole sets of lanes
    K = D // (G * vec)
    if K * G * vec != D or (shuffle and (P % shuffle or shuffle > warp or shuffle > G)) or P % U:
        raise InvalidConfig(f"dim {D}: vector {vec} x {G} threads, unroll {U}, shuffle {shuffle} do not fit")
    i64 = "int64"
    weighted = w.per_sample_weights
    has_pad = w.padding_idx is not None
    pad = w.padding_idx if has_pad else -1
    count_pads = has_pad and mode in ("mean", "max")
    ilo = w.include_last_offset
    identity = -math.inf if mode == "max" else 0.0
    shuffled = shuffle > 0
    per_lane = P // shuffle if shuffled else 1

    def end_of(Off: Any, vb: Any, NB: Any, NNZ: Any) -> Any:
        if ilo:
            return T.Cast(i64, Off[vb + 1])
        return T.if_then_else(vb + 1 < NB, T.Cast(i64, Off[T.min(vb + 1, NB - 1)]), NNZ)

    def group_mask(vb: Any) -> Any:
        # The group's lanes in its warp: a block holds whole warps and bags run consecutively through
        # threadIdx.y, so a bag's group sits at position vb % (warp / G) of its warp.
        if G >= warp:
            return T.uint32(0xFFFFFFFF)
        return T.shift_left(T.uint32((1 << G) - 1), T.Cast("uint32", T.truncmod(vb, T.int64(warp // G)) * G))

    def read(src: Any, start: Any, n: Any, pos: Any, zero: Any) -> Any:
        # src[start + pos] for a position inside the bag; past its end, `zero` (rows: row 0, never added)
        return T.if_then_else(pos < n, src[start + pos], zero)

    def at(vc: Any, jo: Any, ji: Any) -> Any:
        return vc * P + jo * U + ji  # the position in the bag of row ji of step jo of chunk vc

    def lane_pos(vc: Any, i: Any, lane: Any) -> Any:
        # where in the bag lane `lane` reads its i-th value of chunk vc: consecutive lanes, consecutive indices
        return vc * P + i * shuffle + lane

    def broadcast(vb: Any, lanes: Any, src: Any, start: Any, n: Any, vc: Any, vj: Any, zero: Any) -> Any:
        # the chunk's vj-th value, held by lane vj % shuffle as its (vj // shuffle)-th; emulated, the read that
        # lane made (the same expression, so a CPU run checks the index algebra of the shuffled schedule)
        if emulate:
            return read(src, start, n, lane_pos(vc, vj // shuffle, vj % shuffle), zero)
        return T.tvm_warp_shuffle(group_mask(vb), lanes[vj // shuffle], vj % shuffle, shuffle, warp)

    def valid(pos: Any, n: Any, row: Any) -> Any:
        return T.And(pos < n, row != pad) if has_pad else pos < n  # padded rows count as absent

    def combine(acc: Any, value: Any) -> Any:
        return T.max(acc, value) if mode == "max" else acc + value

    def finish(acc: Any, count: Any) -> Any:
        if mode == "mean":
            return acc / T.max(count, T.float32(1))
        if mode == "max":
            return T.if_then_else(count == T.float32(0), T.float32(0), acc)
        return acc

    @T.macro
    def body(W, I, Off, PSW, O, NB, NNZ):
        for b, t in T.grid(NB, G):
            with T.sblock("bag"):
                vb, vt = T.axis.remap("SS", [b, t])
                if weighted:
                    T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:D], PSW[0:NNZ])
                else:
                    T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:D])
                T.writes(O[vb, 0:D])
                acc = T.sblock_alloc_buffer((K, vec), "float32", scope="local")
                row = T.sblock_alloc_buffer((U,), i64, scope="local")
                val = T.sblock_alloc_buffer((U, K, vec), "float32", scope="local")
                # registers of some options only (an allocated buffer must be used)
                if weighted:
                    scale = T.sblock_alloc_buffer((U,), "float32", scope="local")
                if count_pads:
                    cnt = T.sblock_alloc_buffer((1,), "float32", scope="local")
                if shuffled:
                    lane_idx = T.sblock_alloc_buffer((per_lane,), idt, scope="local")
                if shuffled and weighted:
                    lane_psw = T.sblock_alloc_buffer((per_lane,), "float32", scope="local")
                start = T.Cast(i64, Off[vb])
                n = end_of(Off, vb, NB, NNZ) - start
                if count_pads:
                    with T.sblock("count"):
                        cnt[0] = T.Cast("float32", n)
                for c in range(T.floordiv(n + T.int64(P - 1), T.int64(P))):
                    if shuffled:
                        with T.sblock("indices"):
                            vc = T.axis.opaque(T.floordiv(n + T.int64(P - 1), T.int64(P)), c)
                            for i in T.unroll(per_lane):  # one coalesced load per lane and value
                                lane_idx[i] = read(I, start, n, lane_pos(vc, i, vt % shuffle), T.Cast(idt, 0))
                                if weighted:
                                    lane_psw[i] = read(PSW, start, n, lane_pos(vc, i, vt % shuffle), T.float32(0))
                    for jo in range(P // U):
                        if c * P + jo * U < n:  # a step starts inside the bag; its rows past the end are masked
                            # a step in three phases (row indices, U independent row loads, then the adds), so
                            # the compiler issues all U loads before it waits on the first
                            for ji in range(U):
                                with T.sblock("row"):
                                    vc = T.axis.opaque(T.floordiv(n + T.int64(P - 1), T.int64(P)), c)
                                    vjo = T.axis.opaque(P // U, jo)
                                    vji = T.axis.opaque(U, ji)
                                    if shuffled:
                                        row[vji] = T.Cast(i64, broadcast(vb, lane_idx, I, start, n, vc, vjo * U + vji,
                                                                         T.Cast(idt, 0)))
                                        if weighted:
                                            scale[vji] = broadcast(vb, lane_psw, PSW, start, n, vc, vjo * U + vji,
                                                                   T.float32(0))
                                    else:
                                        row[vji] = T.Cast(i64, read(I, start, n, at(vc, vjo, vji), T.Cast(idt, 0)))
                                        if weighted:
                                            scale[vji] = read(PSW, start, n, at(vc, vjo, vji), T.float32(0))
                                    if count_pads:
                                        cnt[0] = cnt[0] - T.Select(T.And(at(vc, vjo, vji) < n, row[vji] == pad),
                                                                   T.float32(1), T.float32(0))
                            for ji, k, v in T.grid(U, K, vec):
                                with T.sblock("gather"):
                                    # unconditional: rows past the bag's end read row 0 and are not added
                                    vji, vk, vv = T.axis.remap("SSS", [ji, k, v])
                                    val[vji, vk, vv] = W[row[vji], (vk * G + vt) * vec + vv]
                            for ji, k, v in T.grid(U, K, vec):
                                with T.sblock("acc"):
                                    vc = T.axis.reduce(T.floordiv(n + T.int64(P - 1), T.int64(P)), c)
                                    vjo, vji = T.axis.remap("RR", [jo, ji])
                                    vk, vv = T.axis.remap("SS", [k, v])
                                    with T.init():
                                        acc[vk, vv] = T.float32(identity)
                                    # a select, not a branch, so that nothing makes the loads conditional
                                    if weighted:
                                        acc[vk, vv] = T.Select(valid(at(vc, vjo, vji), n, row[vji]),
                                                               acc[vk, vv] + val[vji, vk, vv] * scale[vji], acc[vk, vv])
                                    else:
                                        acc[vk, vv] = T.Select(valid(at(vc, vjo, vji), n, row[vji]),
                                                               combine(acc[vk, vv], val[vji, vk, vv]), acc[vk, vv])
                for k, v in T.grid(K, vec):
                    with T.sblock("finalize"):
                        vk, vv = T.axis.remap("SS", [k, v])
                        if count_pads:
                            O[vb, (vk * G + vt) * vec + vv] = finish(acc[vk, vv], cnt[0])
                        else:
                            O[vb, (vk * G + vt) * vec + vv] = finish(acc[vk, vv], T.Cast("float32", n))

    return _module(w, body)


def schedule(sch: Any, w: Workload, cfg: Config, target: Any) -> None:
    """Apply a config to the schedule of the TVMScript `lower` builds for it (`compute` or `compute_gpu`)."""
    if _is_gpu(target):
        _schedule_gpu(sch, w, cfg, target)
    else:
        _schedule_cpu(sch, w, cfg)


def _schedule_cpu(sch: Any, w: Workload, cfg: Config) -> None:
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


def _schedule_gpu(sch: Any, w: Workload, cfg: Config, target: Any, bind: bool = True) -> None:
    """Apply a CUDA config to the schedule of the `compute_gpu` that `lower` built for it."""
    lanes, vec, threads = cfg[DIM_THREADS], cfg[GPU_VECTOR], cfg[THREADS]
    if w.dim % (lanes * vec) or threads % lanes or threads > int(target.attrs["max_threads_per_block"]):
        raise InvalidConfig(f"{lanes} threads x vector {vec} along dim {w.dim} in blocks of {threads} threads")
    _map_bags(sch, w, threads // lanes, bind)
    _unroll_steps(sch, vec)


def _map_bags(sch: Any, w: Workload, bags_per_block: int, bind: bool) -> None:
    """Bags to (blockIdx.x, threadIdx.y), a bag's threads along the dimension to threadIdx.x.

    The grid is a constant, sized for the tuned batch (`ceil(batch / bags per block)` blocks), and each block
    walks its bags in a loop that a larger batch lengthens: the batch stays symbolic (one kernel, one launch,
    any batch) while TVM's GPU verification, which needs constant launch extents, can still check the kernel.
    Unbound (`bind=False`), the thread loops stay serial: the CPU twin of `lower_gpu_emulation`.
    """
    b, t = sch.get_loops(sch.get_sblock("bag"))
    bx, _, ty = sch.split(b, [-(-w.batch // bags_per_block), None, bags_per_block])
    if bind:
        sch.bind(bx, "blockIdx.x")
        sch.bind(ty, "threadIdx.y")
        sch.bind(t, "threadIdx.x")


def _unroll_steps(sch: Any, vec: int) -> None:
    """Unroll a step's rows (independent loads in registers); vector loads, init and stores; masked adds."""
    sch.unroll(sch.get_loops(sch.get_sblock("row"))[-1])
    ji, k, v = sch.get_loops(sch.get_sblock("gather"))[-3:]
    sch.unroll(ji)
    _unroll_vectorize(sch, k, v, vec)
    acc = sch.get_sblock("acc")
    c, _, ji, k, v = sch.get_loops(acc)[-5:]
    for loop in (ji, k, v):  # not vectorised: TVM's CUDA codegen cannot emit a select of vectors
        sch.unroll(loop)
    init = sch.decompose_reduction(acc, c)
    _unroll_vectorize(sch, *sch.get_loops(init)[-2:], vec)
    _unroll_vectorize(sch, *sch.get_loops(sch.get_sblock("finalize"))[-2:], vec)


def _unroll_vectorize(sch: Any, k: Any, v: Any, vec: int) -> None:
    """A thread's (vectors, lanes) loops: the vectors unrolled (registers), the lanes one vector access."""
    sch.unroll(k)
    if vec > 1:
        sch.vectorize(v)


def _shuffle_width(cfg: Config, warp: int) -> int:
    """Lanes that share index loads through shuffles: the bag's group, or its part in one warp (0: off)."""
    return min(cfg[DIM_THREADS], warp) if cfg[INDEX_PREFETCH] == "shuffle" else 0


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The scheduled IRModule for one config: what `tvm.compile` builds."""
    from tvm.s_tir import Schedule

    if _is_gpu(target):
        return _lower_gpu(w, cfg, target)
    sch = Schedule(compute(w, cfg[PREFETCH], cfg[PREFETCH_LINES]))
    _schedule_cpu(sch, w, cfg)
    return sch.mod


def lower_gpu_emulation(w: Workload, cfg: Config, target: Any) -> Any:
    """A CPU-buildable twin of a CUDA config's kernel, to check its numerics where there is no GPU.

    Same TVMScript and schedule (chunks, lane reads, masks, unrolled steps, vector accesses, the bag-to-block
    mapping) with the thread loops left serial and each warp shuffle replaced by the read its source lane made.
    Build it for an `llvm` target. What it cannot check is the hardware: shuffle masks, widths, divergence.
    """
    if not _is_gpu(target):
        raise InvalidConfig(f"lower_gpu_emulation needs a cuda target, got {target.kind.name!r}")
    return _lower_gpu(w, cfg, target, emulate=True)


def _lower_gpu(w: Workload, cfg: Config, target: Any, emulate: bool = False) -> Any:
    from tvm.s_tir import Schedule

    warp = int(target.attrs["thread_warp_size"])
    sch = Schedule(compute_gpu(w, cfg[GPU_VECTOR], cfg[DIM_THREADS], cfg[GPU_UNROLL], _shuffle_width(cfg, warp),
                               warp, emulate))
    _schedule_gpu(sch, w, cfg, target, bind=not emulate)
    return sch.mod


# ---- data, reference, validation ---------------------------------------------------------------------
def _bag_sizes(w: Workload, rng: np.random.Generator) -> np.ndarray:
    lo, hi = w.pooling
    return rng.integers(lo, hi + 1, size=w.batch)


def row_indices(rows: int, n: int, distribution: str, zipf_exponent: float, rng: np.random.Generator) -> np.ndarray:
    """n row indices, uniform or Zipf over ranks 1..rows (inverse CDF), hot ranks scattered by a permutation."""
    if distribution == "uniform":
        return rng.integers(0, rows, size=n)
    cdf = np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -zipf_exponent)
    cdf /= cdf[-1]
    hot = np.searchsorted(cdf, rng.random(n), side="right")
    return rng.permutation(rows)[np.minimum(hot, rows - 1)]


def _indices(w: Workload, n: int, rng: np.random.Generator) -> np.ndarray:
    return row_indices(w.rows, n, w.distribution, w.zipf_exponent, rng)


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
    """Raise a clear error for tensors that would make the kernel read out of bounds or compute garbage.

    Tensors may live on any device (the kernel's: CPU or GPU), but all on the same one.
    """
    import torch

    def need(cond: bool, msg: str, exc: type[Exception] = ValueError) -> None:
        if not cond:
            raise exc(f"embedding_bag: {msg}")

    tensors = {"weight": weight, "indices": indices, "offsets": offsets}
    if per_sample_weights is not None:
        tensors["per_sample_weights"] = per_sample_weights
    for name, t in tensors.items():
        need(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}", TypeError)
        need(t.is_contiguous(), f"{name} must be contiguous")
    devices = {t.device for t in tensors.values()}
    need(len(devices) == 1, "all tensors must be on one device, got "
         + ", ".join(f"{name} on {t.device}" for name, t in tensors.items()))
    need(weight.dtype == torch.float32, f"weight must be float32, got {weight.dtype}", TypeError)
    need(weight.dim() == 2 and weight.shape[1] == w.dim,
         f"weight must be (rows, {w.dim}), got {tuple(weight.shape)}")
    # GPU kernels read rows with 16-byte vector loads: a misaligned view would fault (and kill the context)
    need(weight.device.type != "cuda" or weight.data_ptr() % 16 == 0,
         "weight must start 16-byte aligned on the GPU (vector loads); pass a fresh tensor or a .clone()")
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
    """The table is read in place (no packed weights): arguments are the inputs plus a new output, allocated on
    the inputs' device."""
    import torch

    bags = offsets.numel() - (1 if w.include_last_offset else 0)
    out = torch.empty(bags, w.dim, dtype=torch.float32, device=weight.device)
    args = [weight, indices, offsets] + ([per_sample_weights] if w.per_sample_weights else []) + [out]
    return args, out


def traffic(w: Workload, weight: Any, indices: Any, offsets: Any, per_sample_weights: Any = None) -> Traffic:
    """Gathered bytes: every pooled index reads one table row (the figure FBGEMM and papers report)."""
    nnz = int(offsets[-1]) if w.include_last_offset else indices.numel()
    row_bytes = w.dim * 4
    return Traffic(bytes=float(nnz * row_bytes), ops=float(nnz * w.dim), unit="GB/s")


def tolerance(w: Workload) -> tuple[float, float]:
    return (1e-4, 1e-4 * max(1, w.pooling[1]))
