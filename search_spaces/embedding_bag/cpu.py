"""The embedding bag on the CPU (llvm): its knobs, space, TVMScript and schedule.

The kernel is written in TVMScript because bags are ragged: each bag is an opaque block whose inner reduction
runs over `offsets[b]..offsets[b+1]`, a data-dependent extent TE cannot schedule well. Bags spread over
cores, SIMD runs over the dimension, and rows are prefetched ahead with LLVM's intrinsic. The knobs and
constraints that the table-batched kernel shares are declared here once (`batched_embedding_bag.cpu`).
"""

from __future__ import annotations

import math
from typing import Any

from ..space import Choice, Config, Constraint, InvalidConfig, Space
from .kernel import LINE_FLOATS, boundaries_checker, flag_where, in_range, prefetcher, signature
from .workload import INDEX_ERROR, OFFSETS_ERROR, Workload

# ---- knobs (THREADING to PREFETCH_LINES and ACCUMULATOR: shared with the table-batched kernel) ----------
THREADING = Choice("threading", ("parallel", "serial"), doc=(
    "Bags (of every table, when batched) are independent, so they spread over cores; but on a small or busy "
    "machine the launch and imbalance of a parallel region can cost more than a second core's memory "
    "parallelism brings."))
BAGS_PER_TASK = Choice("bags_per_task", (8, 1, 2, 4, 16, 32, 64), doc=(
    "Bags one parallel task pools in a row: small tasks balance ragged bags (and tables of different heat) "
    "across threads, large ones amortise scheduling and keep a thread's output rows contiguous."))
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
    "issues the miss for the row that many indices ahead, across bag boundaries (across a table boundary of "
    "a batched kernel the guess uses the current table's base: a wasted prefetch, never a fault). 0 disables "
    "it."))
PREFETCH_LINES = Choice("prefetch_lines", (1, 2, 4, 8), doc=(
    "64-byte cache lines of the future row to prefetch: a whole row costs more prefetch slots, a partial "
    "one relies on the hardware's adjacent-line prefetcher."))
ACCUMULATOR = Choice("accumulator", ("output", "local"), doc=(
    "Accumulate into the output row directly, or into a local buffer written back once per bag "
    "(lets LLVM keep partial sums in registers when it cannot prove the output does not alias). "
    "The table-batched kernel offers the output for mode=sum only."))

# ---- constraints shared with the table-batched kernel --------------------------------------------------
LINES_NEED_PREFETCH = Constraint("prefetch_lines only matters with prefetch on",
                                 lambda c: c[PREFETCH] > 0 or c[PREFETCH_LINES] == 1)
TASKS_NEED_PARALLEL = Constraint("bags_per_task only matters for parallel threading",
                                 lambda c: c[THREADING] == "parallel" or c[BAGS_PER_TASK] == BAGS_PER_TASK.options[0])


def vectors(dim: int) -> Choice:
    """VECTOR's widths that divide the dimension."""
    return VECTOR.only(v for v in VECTOR.options if dim % v == 0)


def prefetch_lines(dim: int) -> Choice:
    """PREFETCH_LINES' counts that fit in a row of `dim` floats."""
    return PREFETCH_LINES.only(n for n in PREFETCH_LINES.options if n == 1 or n * LINE_FLOATS <= dim)


def check_llvm(name: str, target: Any) -> None:
    if target.kind.name != "llvm":
        raise InvalidConfig(f"{name} has no CPU schedule for target kind {target.kind.name!r}")


def space(w: Workload, target: Any) -> Space:
    """The CPU space: threading, SIMD width and dimension tiles, unroll, prefetch, accumulator."""
    check_llvm("embedding_bag", target)
    vector = vectors(w.dim)
    tiles = [t for t in DIM_TILES.options if any((w.dim // v) % t == 0 for v in vector.options)]
    return Space(
        [THREADING, BAGS_PER_TASK, vector, DIM_TILES.only(tiles), LOOP_ORDER, UNROLL,
         PREFETCH, prefetch_lines(w.dim), ACCUMULATOR],
        [
            Constraint("dim_tiles must divide dim / vector",
                       lambda c: (w.dim // c[VECTOR]) % c[DIM_TILES] == 0),
            Constraint("tiles_outer needs more than one tile and no prefetch (the prefetch sits in the row loop)",
                       lambda c: c[LOOP_ORDER] == "rows_outer" or (c[DIM_TILES] > 1 and c[PREFETCH] == 0)),
            LINES_NEED_PREFETCH,
            TASKS_NEED_PARALLEL,
        ],
    )


# ---- the computation ------------------------------------------------------------------------------------
def compute(w: Workload, prefetch: int = 0, prefetch_lines: int = 1, check: str = "load") -> Any:
    """The ragged embedding bag as TVMScript. `prefetch` rows ahead are prefetched (0: none).

    Bounds are checked in the kernel (kernel.py): the offsets by a pass over them first (the bags are pooled
    only if they are well formed), each index as it is gathered: one out of the table is not read and sets the
    error flag. How (`check`, picked by the schedule: `checks(cfg)`, each the fastest measured where it is used):
    "load" guards each load of the row (LLVM merges the guards into one branch per row) and sets the flag
    beside them; "branch" puts the row's loads and adds under one branch on its index, the flag set on the
    other side (with the row loop unrolled, "load" kept the guards apart: 11% slower than before the checks
    at the make-tune shape, "branch" 0-2%; without unrolling "branch" stores the accumulators every row);
    "walk" guards the loads and sets the flag by a walk over the bag's indices before it is pooled (schedules
    that move the dimension tiles above the row loop: a statement beside the tile loop stops the reorder).
    """
    from tvm.script import tirx as T

    if check not in ("load", "branch", "walk"):
        raise ValueError(f"check must be load, branch or walk, got {check!r}")
    D, mode = w.dim, w.mode
    weighted = w.per_sample_weights
    has_pad = w.padding_idx is not None
    pad = w.padding_idx if has_pad else -1
    needs_count = mode in ("mean", "max")
    ilo = w.include_last_offset
    identity = -math.inf if mode == "max" else 0.0
    prefetch_row = prefetcher(prefetch_lines)
    flag_if = flag_where()
    check_boundaries = boundaries_checker()
    i64 = "int64"

    def end_of(Off: Any, vb: Any, NB: Any, NNZ: Any) -> Any:
        # With include_last_offset the offsets carry the end of the last bag; otherwise it is len(indices).
        if ilo:
            return T.Cast(i64, Off[vb + 1])
        return T.if_then_else(vb + 1 < NB, T.Cast(i64, Off[T.min(vb + 1, NB - 1)]), NNZ)

    def row_of(I: Any, Off: Any, vb: Any, vl: Any) -> Any:
        return T.Cast(i64, I[T.Cast(i64, Off[vb]) + vl])

    def take(W: Any, row: Any) -> Any:
        # in the table (padded entries are excluded, whatever their weight)
        ok = in_range(row, W.shape[0])
        return T.And(ok, row != pad) if has_pad else ok

    def value(W: Any, I: Any, Off: Any, PSW: Any, vb: Any, vl: Any, vd: Any) -> Any:
        row = row_of(I, Off, vb, vl)
        return W[row, vd] * PSW[T.Cast(i64, Off[vb]) + vl] if weighted else W[row, vd]

    def guarded(W: Any, I: Any, Off: Any, PSW: Any, vb: Any, vl: Any, vd: Any) -> Any:
        # a guarded load: a row out of the table is never read
        if check == "branch":  # the branch around the row guards it
            return value(W, I, Off, PSW, vb, vl, vd) if not has_pad else T.if_then_else(
                row_of(I, Off, vb, vl) == pad, T.float32(identity), value(W, I, Off, PSW, vb, vl, vd))
        return T.if_then_else(take(W, row_of(I, Off, vb, vl)), value(W, I, Off, PSW, vb, vl, vd), T.float32(identity))

    def combine(acc: Any, value: Any) -> Any:
        return T.max(acc, value) if mode == "max" else acc + value

    @T.macro
    def check_row(W, I, Off, Flag, vb, l):
        flag_if(Flag, not in_range(row_of(I, Off, vb, l), W.shape[0]), INDEX_ERROR)

    @T.macro
    def add_row(W, I, Off, PSW, A, vb, l, NB, NNZ):
        for d in range(D):
            with T.sblock("acc"):
                vl = T.axis.reduce(end_of(Off, vb, NB, NNZ) - T.Cast(i64, Off[vb]), l)
                vd = T.axis.spatial(D, d)
                with T.init():
                    A[vb, vd] = T.float32(identity)
                A[vb, vd] = combine(A[vb, vd], guarded(W, I, Off, PSW, vb, vl, vd))

    @T.macro
    def pool(W, I, Off, PSW, A, Flag, vb, NB, NNZ):
        """Reduce the bag's rows into A[vb, :] (the output for sum, a per-bag scratch for mean/max)."""
        if check == "walk":
            for l0 in range(end_of(Off, vb, NB, NNZ) - T.Cast(i64, Off[vb])):
                check_row(W, I, Off, Flag, vb, l0)
        for l in range(end_of(Off, vb, NB, NNZ) - T.Cast(i64, Off[vb])):
            if prefetch > 0:
                # clamped, not guarded: no branch in the loop; the tail re-prefetches the last row (a row out of
                # the table is prefetched harmlessly: a hint, not an access)
                prefetch_row(W, T.Cast(i64, I[T.min(T.Cast(i64, Off[vb]) + l + prefetch, NNZ - 1)]))
            if check == "branch":
                # the branch sits outside the unrolled rows' predicate (l < the bag's length): past the last
                # bag's end its index is read at a clamped position, never beyond the indices tensor
                if in_range(T.Cast(i64, I[T.min(T.Cast(i64, Off[vb]) + l, NNZ - 1)]), W.shape[0]):
                    add_row(W, I, Off, PSW, A, vb, l, NB, NNZ)
                else:
                    flag_if(Flag, True, INDEX_ERROR)
            else:
                if check == "load":
                    check_row(W, I, Off, Flag, vb, l)
                add_row(W, I, Off, PSW, A, vb, l, NB, NNZ)

    @T.macro
    def body(W, I, Off, PSW, O, Flag, NB, NNZ):
        check_boundaries(Off, Flag, NB + (1 if ilo else 0), NNZ, OFFSETS_ERROR)
        if T.bitwise_and(Flag[0], T.int32(OFFSETS_ERROR)) == T.int32(0):  # every bag lies within the indices
            for b in range(NB):
                with T.sblock("bag"):
                    vb = T.axis.spatial(NB, b)
                    if weighted:
                        T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:D], PSW[0:NNZ])
                    else:
                        T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:D])
                    T.writes(O[vb, 0:D])  # and the flag (a benign race: not a region the schedule orders)
                    if needs_count:
                        A = T.sblock_alloc_buffer((NB, D), "float32", scope="local")
                        cnt = T.sblock_alloc_buffer((1,), "float32", scope="local")
                        pool(W, I, Off, PSW, A, Flag, vb, NB, NNZ)
                        with T.sblock("count"):
                            T.reads(Off[vb:vb + 2], I[0:NNZ])
                            T.writes(cnt[0])
                            cnt[0] = T.Cast("float32", end_of(Off, vb, NB, NNZ) - T.Cast(i64, Off[vb]))
                            if has_pad:
                                for l2 in range(end_of(Off, vb, NB, NNZ) - T.Cast(i64, Off[vb])):
                                    if I[T.Cast(i64, Off[vb]) + l2] == pad:
                                        cnt[0] = cnt[0] - T.float32(1)
                        for d2 in range(D):
                            with T.sblock("finalize"):
                                vd2 = T.axis.spatial(D, d2)
                                if mode == "mean":
                                    O[vb, vd2] = A[vb, vd2] / T.max(cnt[0], T.float32(1))
                                else:
                                    O[vb, vd2] = T.if_then_else(cnt[0] == T.float32(0), T.float32(0), A[vb, vd2])
                    else:
                        pool(W, I, Off, PSW, O, Flag, vb, NB, NNZ)
        else:  # flagged: zeros, not whatever the output's memory held
            for b, d in T.grid(NB, D):
                with T.sblock("zero"):
                    vb, vd = T.axis.remap("SS", [b, d])
                    O[vb, vd] = T.float32(0)

    return signature(w, body)


def schedule(sch: Any, w: Workload, cfg: Config) -> None:
    """Apply a CPU config to the schedule of `compute(w, cfg[PREFETCH], cfg[PREFETCH_LINES], checks(cfg))`."""
    vec, tiles = cfg[VECTOR], cfg[DIM_TILES]
    if w.dim % (vec * tiles):
        raise InvalidConfig(f"vector {vec} x dim_tiles {tiles} does not divide dim {w.dim}")
    (b,) = sch.get_loops(sch.get_sblock("bag"))
    parallel_tasks(sch, b, cfg)

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
    unroll_rows(sch, l, cfg)
    if w.mode in ("mean", "max"):
        vectorize_innermost(sch, sch.get_sblock("finalize"), vec)


# ---- schedule steps shared with the table-batched kernel -----------------------------------------------
def parallel_tasks(sch: Any, bags: Any, cfg: Config) -> None:
    """THREADING and BAGS_PER_TASK on the loop over bags: tasks of bags_per_task bags spread over cores."""
    if cfg[THREADING] == "parallel":
        tasks, _ = sch.split(bags, [None, cfg[BAGS_PER_TASK]])
        sch.parallel(tasks)


def unroll_rows(sch: Any, rows: Any, cfg: Config) -> None:
    """UNROLL on a bag's loop over its rows: that many independent row loads in flight."""
    if cfg[UNROLL] > 1:
        _, inner = sch.split(rows, [None, cfg[UNROLL]])
        sch.unroll(inner)


def vectorize_innermost(sch: Any, block: Any, vec: int) -> None:
    """A block's innermost (dimension) loop in SIMD vectors of `vec` lanes."""
    if vec > 1:
        _, inner = sch.split(sch.get_loops(block)[-1], [None, vec])
        sch.vectorize(inner)


def checks(cfg: Config) -> str:
    """How a config's kernel checks its indices (compute's `check`): the fastest way for its loop nest."""
    if cfg[LOOP_ORDER] == "tiles_outer":
        return "walk"
    return "branch" if cfg[UNROLL] > 1 else "load"


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The scheduled IRModule of one CPU config: what `tvm.compile` builds."""
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, cfg[PREFETCH], cfg[PREFETCH_LINES], checks(cfg)))
    schedule(sch, w, cfg)
    return sch.mod
