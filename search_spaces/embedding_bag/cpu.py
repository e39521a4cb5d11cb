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
from .kernel import boundaries_checker, flag_where, in_range, prefetcher, signature
from .rows import RowFormat
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
PREFETCH = Choice("prefetch", (0, 4, 8, 16, 32, 64, 128, 256), doc=(
    "Software-prefetch distance in rows (LLVM's prefetch intrinsic), as FBGEMM's generated kernels do: "
    "issues the miss for the row that many indices ahead, across bag boundaries (across a table boundary of "
    "a batched kernel the guess uses the current table's base: a wasted prefetch, never a fault). 0 disables "
    "it. The distance that keeps enough misses in flight grows with the rows a core pools while one miss is "
    "outstanding: small rows (int8, fp16) are pooled fast and want a long one (64-256)."))
PREFETCH_LINES = Choice("prefetch_lines", (1, 2, 4, 8, 3), doc=(
    "64-byte cache lines of the future row to prefetch: a whole row costs more prefetch slots, a partial "
    "one relies on the hardware's adjacent-line prefetcher. Rows that are not a whole number of lines (int8 "
    "rows carry 8 bytes of scale and bias) straddle one more line than their size says: 3 for an int8 row of "
    "dim 128 (136 bytes), whose last line holds the scale and bias every row reads."))
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


def prefetch_lines(fmt: RowFormat) -> Choice:
    """PREFETCH_LINES' counts up to the cache lines a row can span (rows.py)."""
    return PREFETCH_LINES.only(n for n in PREFETCH_LINES.options if n <= fmt.lines_touched)


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
         PREFETCH, prefetch_lines(w.rows_format), ACCUMULATOR],
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
# The scope of a CPU kernel's per-bag scratch (the accumulator, the count): "global", not "local". TVM lowers a
# local buffer to a heap workspace taken and freed per bag (TVMBackendAllocWorkspace), which LLVM cannot tell
# from the output or the flag, so the unrolled rows stored every sum back; a small global one is a stack slot
# of the parallel task that LLVM keeps in registers (20% faster at the make-tune shape, measured).
SCRATCH_SCOPE = "global"


def compute(w: Workload, prefetch: int = 0, prefetch_lines: int = 1, check: str = "load", unroll: int = 1,
            vector: int = 1, tiles: int = 1, tiles_outer: bool = False, local: bool = False) -> Any:
    """The ragged embedding bag as TVMScript. `prefetch` rows ahead are prefetched (0: none).

    A bag's rows run in whole groups of `unroll` (block "acc", the group's rows unrolled), then the last
    len % unroll one at a time ("acc_tail"): no row is predicated on the bag's length, as every unrolled row
    was when the schedule split the row loop, the predicate inside the SIMD loop (unroll 4 ran 7x slower than
    unroll 1). The accumulator is set by its own block ("acc_init"), so three blocks write it, and a schedule
    vectorizes or decomposes a reduction only in a buffer's one writer: the row blocks' dimension loops are
    written here too (`tiles` tiles, above the rows when `tiles_outer`, of unrolled SIMD vectors of `vector`
    lanes). With `local` (always for mean and max) the bag pools into a scratch (SCRATCH_SCOPE) that
    "finalize" writes to the output once.

    Bounds are checked in the kernel (kernel.py): the offsets by a pass over them first (the bags are pooled
    only if they are well formed), each index as it is gathered: one out of the table is not read and sets the
    error flag. How (`check`, picked by `checks(cfg, w)`, each the fastest measured where it is used):
    "load" guards each load of the row (LLVM merges the guards into one branch per row) and sets the flag
    beside them; "branch" puts the row's loads and adds under one branch on its index, the flag set on the
    other side; "walk" guards the loads and sets the flag by a walk over the bag's indices before it is pooled
    (tiles above the rows: a statement beside the tile loop would split it). Every row a loop visits is in its
    bag, so no check reads past the indices.
    """
    from tvm.script import tirx as T

    if check not in ("load", "branch", "walk"):
        raise ValueError(f"check must be load, branch or walk, got {check!r}")
    if w.dim % (vector * tiles):
        raise InvalidConfig(f"vector {vector} x dim_tiles {tiles} does not divide dim {w.dim}")
    if unroll < 1:
        raise ValueError(f"unroll must be positive, got {unroll}")
    D, mode, U = w.dim, w.mode, unroll
    M = D // (vector * tiles)  # SIMD vectors per tile
    weighted = w.per_sample_weights
    has_pad = w.padding_idx is not None
    pad = w.padding_idx if has_pad else -1
    needs_count = mode in ("mean", "max")
    ilo = w.include_last_offset
    identity = -math.inf if mode == "max" else 0.0
    fmt = w.rows_format
    WD = fmt.width
    # int8 rows pooled into the scratch add their bias once per row, into a column of its own (the scratch's
    # last), not once per element: a convert and an FMA per SIMD vector instead of a convert, an FMA and an add
    split = fmt.fused and mode != "max" and (needs_count or local) and not tiles_outer
    AW = D + 1 if split else D  # the scratch's columns
    prefetch_row = prefetcher(prefetch_lines, fmt)
    flag_if = flag_where()
    check_boundaries = boundaries_checker()
    i64 = "int64"

    def end_of(Off: Any, vb: Any, NB: Any, NNZ: Any) -> Any:
        # With include_last_offset the offsets carry the end of the last bag; otherwise it is len(indices).
        if ilo:
            return T.Cast(i64, Off[vb + 1])
        return T.if_then_else(vb + 1 < NB, T.Cast(i64, Off[T.min(vb + 1, NB - 1)]), NNZ)

    def length(Off: Any, vb: Any, NB: Any, NNZ: Any) -> Any:
        return end_of(Off, vb, NB, NNZ) - T.Cast(i64, Off[vb])

    def row_of(I: Any, Off: Any, vb: Any, vl: Any) -> Any:
        return T.Cast(i64, I[T.Cast(i64, Off[vb]) + vl])

    def take(W: Any, row: Any) -> Any:
        # in the table (padded entries are excluded, whatever their weight)
        ok = in_range(row, W.shape[0])
        return T.And(ok, row != pad) if has_pad else ok

    def value(W: Any, S: Any, I: Any, Off: Any, PSW: Any, vb: Any, vl: Any, vd: Any) -> Any:
        row = row_of(I, Off, vb, vl)
        x = fmt.load(W, S, row, vd, bias=not split)
        return x * PSW[T.Cast(i64, Off[vb]) + vl] if weighted else x

    def bias(S: Any, I: Any, Off: Any, PSW: Any, vb: Any, vl: Any) -> Any:
        b = fmt.bias_of(S, row_of(I, Off, vb, vl))
        return b * PSW[T.Cast(i64, Off[vb]) + vl] if weighted else b

    def guarded_bias(W: Any, S: Any, I: Any, Off: Any, PSW: Any, vb: Any, vl: Any) -> Any:
        # as `guarded`, for the row's bias (split)
        if check == "branch":
            return bias(S, I, Off, PSW, vb, vl) if not has_pad else T.if_then_else(
                row_of(I, Off, vb, vl) == pad, T.float32(0), bias(S, I, Off, PSW, vb, vl))
        return T.if_then_else(take(W, row_of(I, Off, vb, vl)), bias(S, I, Off, PSW, vb, vl), T.float32(0))

    def guarded(W: Any, S: Any, I: Any, Off: Any, PSW: Any, vb: Any, vl: Any, vd: Any) -> Any:
        # a guarded load: a row out of the table is never read
        if check == "branch":  # the branch around the row guards it
            return value(W, S, I, Off, PSW, vb, vl, vd) if not has_pad else T.if_then_else(
                row_of(I, Off, vb, vl) == pad, T.float32(identity), value(W, S, I, Off, PSW, vb, vl, vd))
        return T.if_then_else(take(W, row_of(I, Off, vb, vl)), value(W, S, I, Off, PSW, vb, vl, vd), T.float32(identity))

    def combine(acc: Any, value: Any) -> Any:
        return T.max(acc, value) if mode == "max" else acc + value

    def lanes(n: int) -> Any:
        return T.vectorized(n) if n > 1 else T.serial(n)

    @T.macro
    def check_row(W, I, Off, Flag, vb, l):
        flag_if(Flag, not in_range(row_of(I, Off, vb, l), W.shape[0]), INDEX_ERROR)

    def rows_in(name: str) -> Any:
        """A macro `pool_row(W, S, I, Off, PSW, A, Flag, vb, l, t, NB, NNZ)`: row l of the bag (l < its length), its
        prefetch, check and add in block `name`, of tile t (tiles_outer) or all tiles (one macro per name:
        TVMScript renames a block where its macro is expanded again, whatever name it is given)."""

        @T.macro
        def add_row(W, S, I, Off, PSW, A, vb, l, t, NB, NNZ):
            for dt in range(1 if tiles_outer else tiles):
                for dm in T.unroll(M):
                    for dv in lanes(vector):
                        with T.sblock(name):
                            vl = T.axis.reduce(length(Off, vb, NB, NNZ), l)
                            vd = T.axis.spatial(D, ((t + dt) * M + dm) * vector + dv)
                            A[vb, vd] = combine(A[vb, vd], guarded(W, S, I, Off, PSW, vb, vl, vd))
            if split:
                with T.sblock(name + "_bias"):
                    vl = T.axis.reduce(length(Off, vb, NB, NNZ), l)
                    A[vb, D] = A[vb, D] + guarded_bias(W, S, I, Off, PSW, vb, vl)

        @T.macro
        def pool_row(W, S, I, Off, PSW, A, Flag, vb, l, t, NB, NNZ):
            if prefetch > 0:
                # clamped, not guarded: no branch in the loop; the tail re-prefetches the last row (a row out of
                # the table is prefetched harmlessly: a hint, not an access)
                prefetch_row(W, T.Cast(i64, I[T.min(T.Cast(i64, Off[vb]) + l + prefetch, NNZ - 1)]))
            if check == "branch":
                if in_range(row_of(I, Off, vb, l), W.shape[0]):
                    add_row(W, S, I, Off, PSW, A, vb, l, t, NB, NNZ)
                else:
                    flag_if(Flag, True, INDEX_ERROR)
            else:
                if check == "load":
                    check_row(W, I, Off, Flag, vb, l)
                add_row(W, S, I, Off, PSW, A, vb, l, t, NB, NNZ)

        return pool_row

    group_row, tail_row = rows_in("acc"), rows_in("acc_tail")

    @T.macro
    def rows(W, S, I, Off, PSW, A, Flag, vb, t, NB, NNZ):
        if U == 1:
            for l in range(length(Off, vb, NB, NNZ)):
                group_row(W, S, I, Off, PSW, A, Flag, vb, l, t, NB, NNZ)
        else:
            for g in range(length(Off, vb, NB, NNZ) // U):
                for u in T.unroll(T.int64(U)):
                    group_row(W, S, I, Off, PSW, A, Flag, vb, g * U + u, t, NB, NNZ)
            for r in range(length(Off, vb, NB, NNZ) % U):
                tail_row(W, S, I, Off, PSW, A, Flag, vb, length(Off, vb, NB, NNZ) // U * U + r, t, NB, NNZ)

    @T.macro
    def pool(W, S, I, Off, PSW, A, Flag, vb, NB, NNZ):
        """Reduce the bag's rows into A[vb, :] (the output, or a local buffer), in one block: its only writer
        seen from the bag (sch.parallel refuses a bag whose blocks write the output several times)."""
        with T.sblock("pool"):
            if weighted:
                T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:WD], PSW[0:NNZ])
            else:
                T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:WD])
            T.writes(A[vb, 0:AW])
            for d0 in range(D):
                with T.sblock("acc_init"):
                    vd0 = T.axis.spatial(D, d0)
                    A[vb, vd0] = T.float32(identity)
            if split:
                with T.sblock("bias_init"):
                    A[vb, D] = T.float32(0)
            if check == "walk":
                for l0 in range(length(Off, vb, NB, NNZ)):
                    check_row(W, I, Off, Flag, vb, l0)
            if tiles_outer:
                for t in range(tiles):
                    rows(W, S, I, Off, PSW, A, Flag, vb, t, NB, NNZ)
            else:
                rows(W, S, I, Off, PSW, A, Flag, vb, 0, NB, NNZ)

    @T.macro
    def body(W, S, I, Off, PSW, O, Flag, NB, NNZ):
        check_boundaries(Off, Flag, NB + (1 if ilo else 0), NNZ, OFFSETS_ERROR)
        if T.bitwise_and(Flag[0], T.int32(OFFSETS_ERROR)) == T.int32(0):  # every bag lies within the indices
            for b in range(NB):
                with T.sblock("bag"):
                    vb = T.axis.spatial(NB, b)
                    if weighted:
                        T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:WD], PSW[0:NNZ])
                    else:
                        T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:WD])
                    T.writes(O[vb, 0:D])  # and the flag (a benign race: not a region the schedule orders)
                    if needs_count or local:
                        A = T.sblock_alloc_buffer((NB, AW), "float32", scope=SCRATCH_SCOPE)
                        pool(W, S, I, Off, PSW, A, Flag, vb, NB, NNZ)
                        if needs_count:
                            cnt = T.sblock_alloc_buffer((1,), "float32", scope=SCRATCH_SCOPE)
                            with T.sblock("count"):
                                T.reads(Off[vb:vb + 2], I[0:NNZ])
                                T.writes(cnt[0])
                                cnt[0] = T.Cast("float32", length(Off, vb, NB, NNZ))
                                if has_pad:
                                    for l2 in range(length(Off, vb, NB, NNZ)):
                                        if I[T.Cast(i64, Off[vb]) + l2] == pad:
                                            cnt[0] = cnt[0] - T.float32(1)
                        for d2 in range(D):
                            with T.sblock("finalize"):
                                vd2 = T.axis.spatial(D, d2)
                                if mode == "mean" and split:
                                    O[vb, vd2] = (A[vb, vd2] + A[vb, D]) / T.max(cnt[0], T.float32(1))
                                elif mode == "mean":
                                    O[vb, vd2] = A[vb, vd2] / T.max(cnt[0], T.float32(1))
                                elif mode == "max":
                                    O[vb, vd2] = T.if_then_else(cnt[0] == T.float32(0), T.float32(0), A[vb, vd2])
                                elif split:
                                    O[vb, vd2] = A[vb, vd2] + A[vb, D]
                                else:
                                    O[vb, vd2] = A[vb, vd2]
                    else:
                        pool(W, S, I, Off, PSW, O, Flag, vb, NB, NNZ)
        else:  # flagged: zeros, not whatever the output's memory held
            for b, d in T.grid(NB, D):
                with T.sblock("zero"):
                    vb, vd = T.axis.remap("SS", [b, d])
                    O[vb, vd] = T.float32(0)

    return signature(w, body)


def schedule(sch: Any, w: Workload, cfg: Config) -> None:
    """Apply a CPU config to the schedule of `lower`'s `compute` (which writes the row blocks' loops itself):
    bags over cores, SIMD over the accumulator's setting and its write-back."""
    (b,) = sch.get_loops(sch.get_sblock("bag"))
    parallel_tasks(sch, b, cfg)
    simd(sch, sch.get_sblock("acc_init"), cfg[VECTOR])
    if w.mode in ("mean", "max") or cfg[ACCUMULATOR] == "local":
        vectorize_innermost(sch, sch.get_sblock("finalize"), cfg[VECTOR])


# ---- schedule steps shared with the table-batched kernel -----------------------------------------------
def parallel_tasks(sch: Any, bags: Any, cfg: Config) -> None:
    """THREADING and BAGS_PER_TASK on the loop over bags: tasks of bags_per_task bags spread over cores."""
    if cfg[THREADING] == "parallel":
        tasks, _ = sch.split(bags, [None, cfg[BAGS_PER_TASK]])
        sch.parallel(tasks)


def simd(sch: Any, block: Any, vec: int) -> None:
    """A block's innermost (dimension) loop in unrolled SIMD vectors of `vec` lanes."""
    dm, dv = sch.split(sch.get_loops(block)[-1], [None, vec])
    if vec > 1:
        sch.vectorize(dv)
    sch.unroll(dm)


def vectorize_innermost(sch: Any, block: Any, vec: int) -> None:
    """A block's innermost (dimension) loop in SIMD vectors of `vec` lanes."""
    if vec > 1:
        _, inner = sch.split(sch.get_loops(block)[-1], [None, vec])
        sch.vectorize(inner)


def in_scratch(w: Any, cfg: Config) -> bool:
    """Whether a config's kernel pools into its per-bag scratch (ACCUMULATOR local; mean and max always) rather
    than into the output (either kernel's workload and config)."""
    return cfg[ACCUMULATOR] == "local" or w.mode != "sum"


def checks(cfg: Config, w: Workload) -> str:
    """How a config's kernel checks its indices (compute's `check`): the fastest measured for its loop nest at
    the make-tune shape. Tiles above the rows: "walk". Pooling into the scratch: "branch" (its sums stay in
    registers either way, and the branch is 10-45% faster at every unroll, with prefetch or without). Into the
    output: "load" (under a branch LLVM stores the sums to the output every row: 2.5x slower without
    prefetch, 3% faster with)."""
    if cfg[LOOP_ORDER] == "tiles_outer":
        return "walk"
    return "branch" if in_scratch(w, cfg) else "load"


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The scheduled IRModule of one CPU config: what `tvm.compile` builds."""
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, cfg[PREFETCH], cfg[PREFETCH_LINES], checks(cfg, w), cfg[UNROLL], cfg[VECTOR],
                           cfg[DIM_TILES], cfg[LOOP_ORDER] == "tiles_outer", cfg[ACCUMULATOR] == "local"))
    schedule(sch, w, cfg)
    return sch.mod
