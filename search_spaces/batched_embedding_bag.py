"""Table-batched embedding bag: many tables of different sizes pooled in one kernel launch (FBGEMM's TBE).

DLRM looks up 26 tables per sample. Calling `embedding_bag` per table launches T kernels, each too small to
fill a GPU (or to amortise a CPU parallel region); FBGEMM's `SplitTableBatchedEmbeddingBagsCodegen` instead
takes every table at once, in its layout, which this template follows:

- `weight`: the tables concatenated by rows, `(sum_rows, dim)` float32, one dimension for all tables;
- `table_offsets`: int64, length T+1, the first row of each table in `weight` (`rows` prefix sums);
- `indices`: the indices of all tables concatenated (table-major), each local to its own table;
- `offsets`: length T*B+1, the bag boundaries of the T*B bags (table-major: bag t*B + b is table t, sample b),
  with the end of the last bag included;
- output `(B, T*dim)`: sample b's pooled embeddings of every table side by side, which is what DLRM's
  interaction consumes (`torch.cat(per_table_outputs, dim=1)`).

The kernel is TVMScript, as in `embedding_bag`: each (table, bag) pair is an opaque block whose reduction runs
over `offsets[g]..offsets[g+1]`, accumulated in a small local buffer and written once. The number of tables,
the dimension, mode and index dtype are compiled in; batch, table sizes and bag sizes are runtime values.
CPU: (table, bag) pairs spread over cores, SIMD over the dimension, software prefetch of rows ahead.
CUDA: one grid over all T*B bags, threads along the dimension with 16-byte loads, several bags per block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .embedding_bag import PREFETCH_LINES, UNROLL, parse_pooling, row_indices
from .space import Choice, Config, Constraint, InvalidConfig, Space
from .template import Traffic, Workload as _Workload, WorkloadError

NAME = "batched_embedding_bag"
DOC = ("table-batched embedding_bag (FBGEMM TBE, DLRM's 26 tables): T tables concatenated, one launch, "
       "output (batch, T*dim); sum/mean/max")

EXAMPLE_SHAPE = "rows=1000000x4+100000x8+1000x14,dim=128,batch=2048,pooling=20-80,dist=zipf:1.05"

WEIGHTS: tuple[int, ...] = ()  # nothing to pack: rows are gathered from the concatenated tables as they are

MODES = ("sum", "mean", "max")
INDEX_DTYPES = ("int64", "int32")


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
    (min, max) number of indices per bag (`pooling=20-80`), the same for every table; `distribution` is
    "uniform" or "zipf" (`dist=zipf:1.05`: row popularity ~ 1/rank**zipf_exponent within each table, hot rows
    scattered).
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

    SHAPE_ALIASES = {"index": "index_dtype", "dist": "distribution"}

    @classmethod
    def parse_rows(cls, raw: str) -> tuple[int, ...]:
        return parse_rows(raw)

    @classmethod
    def parse_pooling(cls, raw: str) -> tuple[int, int]:
        return parse_pooling(raw)

    def __post_init__(self) -> None:
        self._normalise_tables()
        self._normalise_distribution()
        if isinstance(self.pooling, int):
            object.__setattr__(self, "pooling", (self.pooling, self.pooling))
        object.__setattr__(self, "pooling", tuple(self.pooling))
        for name in ("dim", "batch"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"{name} must be >= 1, got {getattr(self, name)}")
        lo, hi = self.pooling
        if not 0 <= lo <= hi:
            raise WorkloadError(f"pooling must be 0 <= min <= max, got {lo}-{hi}")
        if self.mode not in MODES:
            raise WorkloadError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.index_dtype not in INDEX_DTYPES:
            raise WorkloadError(f"index dtype must be one of {INDEX_DTYPES}, got {self.index_dtype!r}")
        if self.index_dtype == "int32" and self.tables * self.batch * hi >= 2**31:
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

    def _normalise_distribution(self) -> None:
        if self.distribution.startswith("zipf:"):
            try:
                exponent = float(self.distribution.split(":", 1)[1])
            except ValueError:
                raise WorkloadError(f"dist={self.distribution!r}: expected zipf:EXPONENT") from None
            object.__setattr__(self, "distribution", "zipf")
            object.__setattr__(self, "zipf_exponent", exponent)
        if self.distribution not in ("uniform", "zipf"):
            raise WorkloadError(f"distribution must be uniform or zipf[:EXPONENT], got {self.distribution!r}")
        if self.distribution == "zipf" and self.zipf_exponent <= 0:
            raise WorkloadError(f"zipf exponent must be > 0, got {self.zipf_exponent}")

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
                    self.zipf_exponent if self.distribution == "zipf" else 0.0)}


# ---- knobs: CPU ---------------------------------------------------------------------------------------
THREADING = Choice("threading", ("parallel", "serial"), doc=(
    "(table, bag) pairs are independent, so they spread over cores; on a small or busy machine the launch "
    "and imbalance of a parallel region can cost more than a second core's memory parallelism brings."))
BAGS_PER_TASK = Choice("bags_per_task", (8, 1, 2, 4, 16, 32, 64), doc=(
    "(table, bag) pairs one parallel task pools in a row: small tasks balance ragged bags and tables of "
    "different heat across threads, large ones amortise scheduling."))
VECTOR = Choice("vector", (8, 4, 16, 1), doc=(
    "SIMD lanes over the embedding dimension (8 fp32 = one AVX2 register); must divide the dimension."))
PREFETCH = Choice("prefetch", (0, 4, 8, 16, 32), doc=(
    "Software-prefetch distance in rows (LLVM's prefetch intrinsic), as FBGEMM's generated kernels do: "
    "issues the miss for the row that many indices ahead. Across a table boundary the guess uses the current "
    "table's base (a wasted prefetch, never a fault). 0 disables it."))
ACCUMULATOR = Choice("accumulator", ("local", "output"), doc=(
    "Pool into a per-bag local buffer written to the output once (LLVM may keep it in registers), or "
    "accumulate in the output row directly (sum only: no copy, but stores in the loop)."))

# ---- knobs: CUDA --------------------------------------------------------------------------------------
GPU_VECTOR = Choice("gpu_vector", (4, 2, 1), doc=(
    "fp32 lanes one thread loads at once: 4 is a 16-byte (float4) load, the widest a thread can issue, so a "
    "warp reads 512 contiguous bytes of a row per instruction. Must divide the dimension."))
DIM_ITERS = Choice("dim_iters", (1, 2, 4), doc=(
    "Vector loads per thread per row: threads along the dimension = dim / (gpu_vector * dim_iters). More "
    "loads per thread give each thread independent loads in flight and free threads for more bags."))
THREADS = Choice("threads", (256, 128, 512, 64, 1024), doc=(
    "Threads per block (at most): threads // (threads along the dimension) bags share a block. Small blocks "
    "schedule ragged bags finely; large ones amortise block launch. Capped by the target's max threads per "
    "block."))
BAG_ROUNDS = Choice("bag_rounds", (1, 2, 4, 8), doc=(
    "Bags each row of threads pools one after another: 1 launches a block per `threads / dim threads` bags "
    "of the tuned batch (the hardware spreads ragged bags over the SMs as blocks finish); more make fewer, "
    "longer-lived blocks that amortise block start-up. Larger batches than tuned still run: the blocks "
    "stride over them."))
GPU_UNROLL = Choice("gpu_unroll", (4, 1, 2, 8), doc=(
    "Rows of a bag gathered per unrolled step: independent loads in flight per thread hide DRAM latency "
    "(Little's law); more costs registers."))

def _is_gpu(target: Any) -> bool:
    return target.kind.name == "cuda"


def space(w: Workload, target: Any) -> Space:
    """The knob space of this workload on the target: CPU (llvm) or CUDA."""
    if _is_gpu(target):
        return _gpu_space(w, target)
    if target.kind.name != "llvm":
        raise InvalidConfig(f"batched_embedding_bag has no schedule for target kind {target.kind.name!r}")
    return _cpu_space(w)


def _cpu_space(w: Workload) -> Space:
    vectors = [v for v in VECTOR.options if w.dim % v == 0]
    lines = [n for n in PREFETCH_LINES.options if n == 1 or n * 16 <= w.dim]
    accumulators = ACCUMULATOR.options if w.mode == "sum" else ("local",)
    return Space(
        [THREADING, BAGS_PER_TASK, VECTOR.only(vectors), UNROLL, PREFETCH, PREFETCH_LINES.only(lines),
         ACCUMULATOR.only(accumulators)],
        [
            Constraint("prefetch_lines only matters with prefetch on",
                       lambda c: c[PREFETCH] > 0 or c[PREFETCH_LINES] == 1),
            Constraint("bags_per_task only matters for parallel threading",
                       lambda c: c[THREADING] == "parallel" or c[BAGS_PER_TASK] == BAGS_PER_TASK.options[0]),
        ],
    )


def _gpu_space(w: Workload, target: Any) -> Space:
    max_threads = int(target.attrs["max_threads_per_block"])
    warp = int(target.attrs["thread_warp_size"])
    vectors = [v for v in GPU_VECTOR.options if w.dim % v == 0]
    iters = [i for i in DIM_ITERS.options if any(w.dim % (v * i) == 0 for v in vectors)]
    threads = [t for t in THREADS.options if t <= max_threads and t % warp == 0]
    if not threads:
        raise InvalidConfig(f"no block size of {THREADS.options} fits {max_threads} threads per block")
    return Space(
        [GPU_VECTOR.only(vectors), DIM_ITERS.only(iters), THREADS.only(threads), BAG_ROUNDS, GPU_UNROLL],
        [
            Constraint("gpu_vector * dim_iters must divide dim",
                       lambda c: w.dim % (c[GPU_VECTOR] * c[DIM_ITERS]) == 0),
            Constraint("a block must hold at least one bag: threads along dim <= threads per block",
                       lambda c: _dim_threads(w, c) <= c[THREADS]),
        ],
    )


def _blocks_per_table(w: Workload, cfg: Config) -> int:
    """The grid's x extent (y is the table): enough blocks for the tuned batch in `bag_rounds` rounds."""
    bags_per_block = (cfg[THREADS] // _dim_threads(w, cfg)) * cfg[BAG_ROUNDS]
    return -(-w.batch // bags_per_block)


def _dim_threads(w: Workload, cfg: Config) -> int:
    """Threads that share one bag, along the dimension."""
    return w.dim // (cfg[GPU_VECTOR] * cfg[DIM_ITERS])


# ---- the computation ------------------------------------------------------------------------------------
def compute(w: Workload, prefetch: int = 0, prefetch_lines: int = 1, direct: bool = False, stage: int = 0) -> Any:
    """The table-batched ragged embedding bag as TVMScript.

    `prefetch` rows ahead are prefetched (0: none; CPU); `direct` (sum only) accumulates into the output
    instead of a local buffer. `stage` > 0 (GPU) walks each bag `stage` rows per step: the step first gathers
    its rows into registers, then pools them. The bag's loop is rounded up to whole steps, the extra rows
    re-reading the bag's last row (a cache hit) and pooling as nothing, so no load sits under a per-row
    branch: with a guarded unrolled loop nvcc keeps one row load in flight per thread (seen in the SASS), with
    the unguarded stage it overlaps the next rows' loads with the adds.
    """
    import tvm
    from tvm.script import tirx as T

    if direct and w.mode != "sum":
        raise InvalidConfig("accumulating in the output is only possible for mode=sum")
    D, NT, idt, mode, U = w.dim, w.tables, w.index_dtype, w.mode, max(stage, 1)
    line_floats = 16
    identity = -math.inf if mode == "max" else 0.0
    i64 = "int64"

    def start(Off: Any, vt: Any, vb: Any, NB: Any) -> Any:
        return T.Cast(i64, Off[vt * NB + vb])

    def count(Off: Any, vt: Any, vb: Any, NB: Any) -> Any:
        return T.Cast(i64, Off[vt * NB + vb + 1]) - T.Cast(i64, Off[vt * NB + vb])

    def steps(Off: Any, vt: Any, vb: Any, NB: Any) -> Any:
        return T.floordiv(count(Off, vt, vb, NB) + (U - 1), U)

    def row(W: Any, TO: Any, I: Any, Off: Any, vt: Any, vb: Any, NB: Any, vl: Any, vd: Any) -> Any:
        return W[TO[vt] + T.Cast(i64, I[start(Off, vt, vb, NB) + vl]), vd]

    def staged_row(W: Any, TO: Any, I: Any, Off: Any, vt: Any, vb: Any, NB: Any, vl: Any, vd: Any) -> Any:
        """Element vd of the bag's vl-th row; past the end, of its last row, pooling as nothing."""
        last = T.Cast(i64, Off[vt * NB + vb + 1]) - 1
        value = W[TO[vt] + T.Cast(i64, I[T.min(start(Off, vt, vb, NB) + vl, last)]), vd]
        if mode == "max":
            return value  # re-pooling the last row changes no maximum
        # masked to +0.0 bit by bit: the load stays unconditional (an if_then_else would put it under a
        # branch) and no inf or NaN of the repeated row leaks in (as value * 0 would)
        keep = T.Select(vl < count(Off, vt, vb, NB), T.int32(-1), T.int32(0))
        return T.reinterpret("float32", T.bitwise_and(T.reinterpret("int32", value), keep))

    def combine(acc: Any, value: Any) -> Any:
        return T.max(acc, value) if mode == "max" else acc + value

    def finish(acc: Any, n: Any) -> Any:
        if mode == "mean":
            return acc / T.Cast("float32", T.max(n, T.int64(1)))
        if mode == "max":
            return T.if_then_else(n == T.int64(0), T.float32(0), acc)
        return acc

    @T.macro
    def pool(W, TO, I, Off, A, O, vt, vb, NB, NNZ, R):
        """Reduce bag (vt, vb)'s rows into A[0:D] (or straight into its output row when `direct`)."""
        for l in range(count(Off, vt, vb, NB)):
            if prefetch > 0:
                with T.sblock("prefetch"):
                    T.reads()
                    T.writes()
                    # clamped, not guarded: no branch in the loop; the tail re-prefetches the last row. Near a
                    # table's end the guess uses this table's base: a wasted prefetch, never a fault.
                    for c in T.unroll(prefetch_lines):
                        T.evaluate(T.call_llvm_intrin(
                            "void", "llvm.prefetch.p0", T.address_of(W[T.min(TO[vt] + T.Cast(i64, I[T.min(
                                start(Off, vt, vb, NB) + l + prefetch, NNZ - 1)]), R - 1), c * line_floats]),
                            0, 3, 1))
            for d in range(D):
                with T.sblock("acc"):
                    vl = T.axis.reduce(count(Off, vt, vb, NB), l)
                    vd = T.axis.spatial(D, d)
                    if direct:
                        with T.init():
                            O[vb, vt * D + vd] = T.float32(identity)
                        O[vb, vt * D + vd] = combine(O[vb, vt * D + vd], row(W, TO, I, Off, vt, vb, NB, vl, vd))
                    else:
                        with T.init():
                            A[vd] = T.float32(identity)
                        A[vd] = combine(A[vd], row(W, TO, I, Off, vt, vb, NB, vl, vd))

    @T.macro
    def pool_staged(W, TO, I, Off, A, G, vt, vb, NB):
        """Reduce bag (vt, vb)'s rows into A[0:D], U rows per step through the stage G[0:U, 0:D]."""
        for s in range(steps(Off, vt, vb, NB)):
            for u, d in T.grid(U, D):
                with T.sblock("gather"):
                    vs = T.axis.spatial(steps(Off, vt, vb, NB), s)
                    vu = T.axis.spatial(U, u)
                    vd = T.axis.spatial(D, d)
                    G[vu, vd] = staged_row(W, TO, I, Off, vt, vb, NB, vs * U + vu, vd)
            for u, d in T.grid(U, D):
                with T.sblock("acc"):
                    vs = T.axis.reduce(steps(Off, vt, vb, NB), s)
                    vu = T.axis.reduce(U, u)
                    vd = T.axis.spatial(D, d)
                    with T.init():
                        A[vd] = T.float32(identity)
                    A[vd] = combine(A[vd], G[vu, vd])

    @T.prim_func(s_tir=True)
    def main(w_: T.handle, toff: T.handle, ind: T.handle, off: T.handle, out: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        R = T.int64()
        NNZ = T.int64()
        NB = T.int64()
        W = T.match_buffer(w_, (R, D), "float32")
        TO = T.match_buffer(toff, (NT + 1,), "int64")
        I = T.match_buffer(ind, (NNZ,), idt)
        O = T.match_buffer(out, (NB, NT * D), "float32")
        Off = T.match_buffer(off, (NT * NB + 1,), idt)
        for t, b in T.grid(NT, NB):
            with T.sblock("bag"):
                vt = T.axis.spatial(NT, t)
                vb = T.axis.spatial(NB, b)
                T.reads(Off[vt * NB + vb:vt * NB + vb + 2], TO[vt], I[0:NNZ], W[0:R, 0:D])
                T.writes(O[vb, vt * D:vt * D + D])
                if direct:
                    pool(W, TO, I, Off, O, O, vt, vb, NB, NNZ, R)  # A unused: O stands in to type-check
                else:
                    A = T.sblock_alloc_buffer((D,), "float32", scope="local")
                    if stage > 0:
                        G = T.sblock_alloc_buffer((U, D), "float32", scope="local")
                        pool_staged(W, TO, I, Off, A, G, vt, vb, NB)
                    else:
                        pool(W, TO, I, Off, A, O, vt, vb, NB, NNZ, R)
                    for d2 in range(D):
                        with T.sblock("finalize"):
                            vd2 = T.axis.spatial(D, d2)
                            O[vb, vt * D + vd2] = finish(A[vd2], count(Off, vt, vb, NB))

    return tvm.IRModule({"main": main})


def schedule(sch: Any, w: Workload, cfg: Config, target: Any, bind_threads: bool = True) -> None:
    """Apply a config to the schedule of `compute(w, ...)` built for it by `lower`.

    `bind_threads=False` leaves a GPU schedule's thread loops serial, so that the exact loop nest a GPU
    config runs can be compiled and checked on a CPU.
    """
    if _is_gpu(target):
        _schedule_gpu(sch, w, cfg, target, bind_threads)
    else:
        _schedule_cpu(sch, w, cfg)


def _schedule_cpu(sch: Any, w: Workload, cfg: Config) -> None:
    """Parallel over fused (table, bag) pairs; SIMD over the dimension; the pooling loop unrolled."""
    vec = cfg[VECTOR]
    if w.dim % vec:
        raise InvalidConfig(f"vector {vec} does not divide dim {w.dim}")
    t, b = sch.get_loops(sch.get_sblock("bag"))
    pairs = sch.fuse(t, b)
    if cfg[THREADING] == "parallel":
        outer, _ = sch.split(pairs, [None, cfg[BAGS_PER_TASK]])
        sch.parallel(outer)
    acc = sch.get_sblock("acc")
    l, d = sch.get_loops(acc)[-2:]
    dm, dv = sch.split(d, [None, vec])
    if vec > 1:
        sch.vectorize(dv)
    sch.unroll(dm)
    init = sch.decompose_reduction(acc, l)
    _vectorize_innermost(sch, init, vec)
    if cfg[UNROLL] > 1:
        _, li = sch.split(l, [None, cfg[UNROLL]])
        sch.unroll(li)
    if cfg[ACCUMULATOR] == "local":
        _vectorize_innermost(sch, sch.get_sblock("finalize"), vec)


def _vectorize_innermost(sch: Any, block: Any, vec: int) -> None:
    if vec > 1:
        _, inner = sch.split(sch.get_loops(block)[-1], [None, vec])
        sch.vectorize(inner)


def _schedule_gpu(sch: Any, w: Workload, cfg: Config, target: Any, bind_threads: bool = True) -> None:
    """One launch for all T*B bags: blockIdx.y is the table, blockIdx.x x threadIdx.y its bags, threadIdx.x
    the dimension.

    Each thread owns `dim_iters` vectors of `gpu_vector` floats of its bag's rows (interleaved, so that a
    warp's loads of one row are contiguous 16-byte loads), gathers `gpu_unroll` rows per step into registers,
    pools them into register accumulators and stores its lanes of the output row once.
    """
    vec, iters, threads = cfg[GPU_VECTOR], cfg[DIM_ITERS], cfg[THREADS]
    if w.dim % (vec * iters):
        raise InvalidConfig(f"gpu_vector {vec} x dim_iters {iters} does not divide dim {w.dim}")
    tx = _dim_threads(w, cfg)
    if tx > threads or threads > int(target.attrs["max_threads_per_block"]):
        raise InvalidConfig(f"{threads} threads per block cannot hold a bag of {tx} threads "
                            f"(max {int(target.attrs['max_threads_per_block'])})")

    def bind(loop: Any, axis: str) -> None:
        if bind_threads:
            sch.bind(loop, axis)

    t, b = sch.get_loops(sch.get_sblock("bag"))
    # blocks sized for the tuned batch, striding over larger ones: thread extents stay constants (TVM's GPU
    # verification requires it) while the batch stays a runtime value, and no bag divides by the batch
    stride, bx, ty = sch.split(b, [None, _blocks_per_table(w, cfg), threads // tx])
    sch.reorder(t, bx, ty, stride)
    bind(t, "blockIdx.y")
    bind(bx, "blockIdx.x")
    bind(ty, "threadIdx.y")
    for name in ("gather", "acc", "finalize"):
        bind(_split_lanes(sch, sch.get_sblock(name), tx, iters, vec, rows=name != "finalize"), "threadIdx.x")
    steps = sch.get_loops(sch.get_sblock("gather"))[-5]
    sch.decompose_reduction(sch.get_sblock("acc"), steps)  # the init copies the lanes' loop kinds


def _split_lanes(sch: Any, block: Any, tx: int, iters: int, vec: int, rows: bool) -> Any:
    """Split a block's innermost (dimension) loop as iterations x threads x vector lanes, the threads hoisted
    above the step's row loop when the block has one (`rows`); returns the threads' loop."""
    *_, d = sch.get_loops(block)
    di, dx, dv = sch.split(d, [iters, tx, vec])
    if rows:
        u = sch.get_loops(block)[-4]
        sch.reorder(dx, u, di, dv)
        sch.unroll(u)
    else:
        sch.reorder(dx, di, dv)
    _unroll_vectorize(sch, (di, dv), vec)
    return dx


def _unroll_vectorize(sch: Any, loops: Sequence[Any], vec: int) -> None:
    """(dim iterations, vector lanes) loops: the first unrolled, the second vectorised when wider than 1."""
    sch.unroll(loops[0])
    if vec > 1:
        sch.vectorize(loops[1])


def lower(w: Workload, cfg: Config, target: Any, bind_threads: bool = True) -> Any:
    """The scheduled IRModule for one config: what `tvm.compile` builds (see `schedule` for bind_threads)."""
    from tvm.s_tir import Schedule

    if _is_gpu(target):
        sch = Schedule(compute(w, stage=cfg[GPU_UNROLL]))
    else:
        sch = Schedule(compute(w, cfg[PREFETCH], cfg[PREFETCH_LINES], direct=cfg[ACCUMULATOR] == "output"))
    schedule(sch, w, cfg, target, bind_threads)
    return sch.mod


# ---- data, reference, validation ---------------------------------------------------------------------
def _table_indices(w: Workload, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    return row_indices(rows, n, w.distribution, w.zipf_exponent, rng)


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(weight, table_offsets, indices, offsets) as torch CPU tensors, in FBGEMM's TBE layout."""
    import torch

    rng = np.random.default_rng(seed)
    lo, hi = w.pooling
    sizes = rng.integers(lo, hi + 1, size=(w.tables, w.batch))  # table-major bags
    offsets = np.zeros(w.tables * w.batch + 1, dtype=np.int64)
    np.cumsum(sizes.reshape(-1), out=offsets[1:])
    indices = np.concatenate([_table_indices(w, rows, int(n), rng) for rows, n in zip(w.rows, sizes.sum(1))])
    table_offsets = np.zeros(w.tables + 1, dtype=np.int64)
    np.cumsum(w.rows, out=table_offsets[1:])
    weight = torch.randn(w.total_rows, w.dim, generator=torch.Generator().manual_seed(seed))
    tdt = getattr(torch, w.index_dtype)
    return (weight, torch.from_numpy(table_offsets), torch.from_numpy(indices.astype(np.int64)).to(tdt),
            torch.from_numpy(offsets).to(tdt))


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
    """PyTorch, one `embedding_bag` per table on its slice of the concatenated weight, then `cat(dim=1)`."""
    import torch
    import torch.nn.functional as F

    outs = [F.embedding_bag(idx, weight[r0:r1], off, mode=w.mode, include_last_offset=True)
            for r0, r1, idx, off in _per_table(table_offsets, indices, offsets, _batch_of(w, offsets))]
    return torch.cat(outs, dim=1)


def baselines(w: Workload, weight: Any, table_offsets: Any, indices: Any, offsets: Any) -> dict[str, Callable[[], Any]]:
    """PyTorch's ways to do it, their inputs prepared outside the timing.

    `torch_per_table`: T `embedding_bag` calls (T launches) and a cat, as DLRM's reference model does.
    `torch_one_bag`: one `embedding_bag` over the concatenated weight with global row indices (one launch),
    then the (T, B, D) -> (B, T*D) transpose the output layout needs.
    """
    import torch
    import torch.nn.functional as F

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

    return {"torch_per_table": per_table, "torch_one_bag": one_bag}


def check_inputs(w: Workload, weight: Any, table_offsets: Any, indices: Any, offsets: Any) -> None:
    """Raise a clear error for tensors that would make the kernel read out of bounds or compute garbage."""
    import torch

    def need(cond: bool, msg: str, exc: type[Exception] = ValueError) -> None:
        if not cond:
            raise exc(f"batched_embedding_bag: {msg}")

    tensors = {"weight": weight, "table_offsets": table_offsets, "indices": indices, "offsets": offsets}
    for name, t in tensors.items():
        need(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}", TypeError)
        need(t.device == weight.device, f"{name} is on {t.device} but weight is on {weight.device}: "
             "all inputs must be on one device")
        need(t.is_contiguous(), f"{name} must be contiguous")
    need(weight.dtype == torch.float32, f"weight must be float32, got {weight.dtype}", TypeError)
    need(weight.dim() == 2 and weight.shape[1] == w.dim,
         f"weight must be (sum of table rows, {w.dim}), got {tuple(weight.shape)}")
    need(weight.device.type == "cpu" or weight.data_ptr() % 16 == 0,
         "weight must start on a 16-byte boundary on a GPU (its rows are read with 16-byte loads); "
         "a view that starts mid-allocation is not: pass weight.clone()")
    need(table_offsets.dtype == torch.int64, f"table_offsets must be int64, got {table_offsets.dtype}", TypeError)
    need(table_offsets.shape == (w.tables + 1,),
         f"table_offsets must have tables + 1 = {w.tables + 1} entries, got {tuple(table_offsets.shape)}")
    idt = getattr(torch, w.index_dtype)
    need(indices.dtype == idt and offsets.dtype == idt,
         f"indices and offsets must be {w.index_dtype}, got {indices.dtype} and {offsets.dtype}", TypeError)
    need(indices.dim() == 1 and offsets.dim() == 1, "indices and offsets must be 1-D")
    need(offsets.numel() > 1 and (offsets.numel() - 1) % w.tables == 0,
         f"offsets must have tables x batch + 1 entries (tables = {w.tables}), got {offsets.numel()}")
    _check_monotone(need, "table_offsets", table_offsets, weight.shape[0], "the weight's rows")
    need(int(table_offsets[-1]) == weight.shape[0],
         f"table_offsets[-1] = {int(table_offsets[-1])} must equal the weight's {weight.shape[0]} rows")
    _check_monotone(need, "offsets", offsets, indices.numel(), "indices")
    _check_index_range(need, table_offsets, indices, offsets, _batch_of(w, offsets))


def _check_monotone(need: Callable[..., None], name: str, t: Any, limit: int, what: str) -> None:
    need(int(t[0]) == 0, f"{name}[0] must be 0, got {int(t[0])}")
    need(bool((t[1:] >= t[:-1]).all()), f"{name} must be non-decreasing")
    need(int(t[-1]) <= limit, f"{name}[-1] = {int(t[-1])} exceeds the {limit} {what}")


def _check_index_range(need: Callable[..., None], table_offsets: Any, indices: Any, offsets: Any,
                       batch: int) -> None:
    """Every index must be a row of its own table: 0 <= index < rows of table t."""
    import torch

    nnz = int(offsets[-1])
    if nnz == 0:
        return
    per_table = (offsets[batch::batch] - offsets[:-1:batch]).long()
    table_of = torch.repeat_interleave(torch.arange(per_table.numel(), device=indices.device), per_table)
    used = indices[:nnz].long()
    rows = (table_offsets[1:] - table_offsets[:-1])[table_of]
    bad = (used < 0) | (used >= rows)
    if bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        t = int(table_of[k])
        need(False, f"index {int(used[k])} at position {k} is out of range for table {t}, which has "
             f"{int(rows[k])} rows (indices are local to their table: [0, rows))", IndexError)


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], weight: Any, table_offsets: Any, indices: Any,
                offsets: Any) -> tuple[Sequence[Any], Any]:
    """The tables are read in place (no packed weights): arguments are the inputs plus a new output."""
    import torch

    out = torch.empty(_batch_of(w, offsets), w.tables * w.dim, dtype=torch.float32, device=weight.device)
    return [weight, table_offsets, indices, offsets, out], out


def traffic(w: Workload, weight: Any, table_offsets: Any, indices: Any, offsets: Any) -> Traffic:
    """Gathered bytes: every pooled index reads one table row (the figure FBGEMM and papers report)."""
    nnz = int(offsets[-1])
    return Traffic(bytes=float(nnz * w.dim * 4), ops=float(nnz * w.dim), unit="GB/s")


def tolerance(w: Workload) -> tuple[float, float]:
    return (1e-4, 1e-4 * max(1, w.pooling[1]))
