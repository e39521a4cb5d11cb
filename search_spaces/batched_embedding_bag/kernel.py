"""The table-batched kernel as TVMScript, shared by the CPU and the CUDA schedules (cpu.py, cuda.py).

As in `embedding_bag`, each (table, bag) pair is an opaque block whose reduction runs over
`offsets[g]..offsets[g+1]`, accumulated in a small local buffer and written once. The number of tables, the
dimension, mode and index dtype are compiled in; batch, table sizes and bag sizes are runtime values.

Bounds are checked in the kernel, as embedding_bag's are (`embedding_bag.kernel`): every index against its own
table's rows, the offsets and the table offsets as boundaries (on the CPU by a pass over them before the
gather, which runs only if both are well formed; on a GPU per bag, where a bad bag or table pools nothing). A
bad index is not read (CPU: a guarded load; GPU: its table's first row is loaded in its place and masked) and
sets the error flag, the kernel's last argument.
"""

from __future__ import annotations

import math
from typing import Any

from ..embedding_bag.cpu import SCRATCH_SCOPE
from ..embedding_bag.kernel import (bag_length, bag_ok, boundaries_checker, flag_where, in_range, index_alignment,
                                    prefetcher)
from ..embedding_bag.workload import INDEX_ERROR, OFFSETS_ERROR, TABLE_OFFSETS_ERROR
from ..space import InvalidConfig
from .workload import Workload

NEG_INF_BITS = -8388608  # 0xff800000: -inf as an int32 bit pattern


def compute(w: Workload, prefetch: int = 0, prefetch_lines: int = 1, direct: bool = False, stage: int = 0,
            branch: bool = False, unroll: int = 1, vector: int = 1, runs: int = 0) -> Any:
    """The table-batched ragged embedding bag as TVMScript.

    `prefetch` rows ahead are prefetched (0: none; CPU); `direct` (sum only) accumulates into the output
    instead of a local buffer; `branch` (CPU) puts a row's loads and adds under one branch on its index rather
    than guarding each load (faster where it pools into the local scratch: `embedding_bag.cpu.checks`). On the
    CPU a bag's rows run in whole groups of `unroll` (block "acc", unrolled), then the last len % unroll one
    at a time ("acc_tail"), each row's dimension in unrolled SIMD vectors of `vector` lanes: no row is
    predicated on the bag's length (as `embedding_bag.cpu.compute`, and why its loops are written here). `stage`
    > 0 (GPU) walks each bag `stage` rows per step: the step first gathers its rows into registers, then pools
    them. The bag's loop is rounded up to whole steps, the extra rows re-reading the bag's last row (a cache
    hit) and pooling as nothing, so no load sits under a per-row branch: with a guarded unrolled loop nvcc
    keeps one row load in flight per thread (seen in the SASS), with the unguarded stage it overlaps the next
    rows' loads with the adds. `runs` > 0 (CPU, local scratch): the pairs run table-major in that many
    parallel runs of equal work (`even_bags`), the loop the schedule would otherwise split into tasks written
    here (its bounds are found at run time).
    """
    import tvm
    from tvm.script import tirx as T

    if direct and w.mode != "sum":
        raise InvalidConfig("accumulating in the output is only possible for mode=sum")
    if runs and (direct or stage):
        raise InvalidConfig("runs of equal work pool into a local scratch, on a CPU")
    if w.dim % vector:
        raise InvalidConfig(f"vector {vector} does not divide dim {w.dim}")
    if unroll < 1:
        raise ValueError(f"unroll must be positive, got {unroll}")
    D, NT, idt, mode, U = w.dim, w.tables, w.index_dtype, w.mode, max(stage, 1)
    gpu = stage > 0
    even = runs > 0  # table-major pairs cut into `runs` runs of equal work (indices + bags)
    ialign = index_alignment(idt)
    identity = -math.inf if mode == "max" else 0.0
    i64 = "int64"
    fmt = w.rows_format
    WD = fmt.width
    # int8 rows pooled into the CPU scratch add their bias once per row, into a column of its own (the scratch's
    # last), not once per element (as embedding_bag.cpu.compute's `split`)
    split = fmt.fused and mode != "max" and not direct and not gpu
    AW = D + 1 if split else D  # the scratch's columns
    prefetch_row = prefetcher(prefetch_lines, fmt)
    flag_if = flag_where()
    check_boundaries = boundaries_checker()

    def start(Off: Any, vt: Any, vb: Any, NB: Any) -> Any:
        return T.Cast(i64, Off[vt * NB + vb])

    def end(Off: Any, vt: Any, vb: Any, NB: Any) -> Any:
        return T.Cast(i64, Off[vt * NB + vb + 1])

    def table_ok(TO: Any, vt: Any, R: Any) -> Any:
        return bag_ok(TO[vt], TO[vt + 1], R)  # 0 <= first row <= end row <= R

    def rows_of(TO: Any, vt: Any) -> Any:
        return TO[vt + 1] - TO[vt]

    def count(TO: Any, Off: Any, vt: Any, vb: Any, NB: Any, NNZ: Any, R: Any) -> Any:
        """The bag's rows to pool. CPU: as the offsets say (checked before the gather). GPU: none for a bag
        outside the indices or of a bad or empty table (no row to load in place of a bad index)."""
        if not gpu:
            return end(Off, vt, vb, NB) - start(Off, vt, vb, NB)
        usable = T.And(table_ok(TO, vt, R), rows_of(TO, vt) > T.int64(0))
        return T.Select(usable, bag_length(start(Off, vt, vb, NB), end(Off, vt, vb, NB), NNZ), T.int64(0))

    def steps(TO: Any, Off: Any, vt: Any, vb: Any, NB: Any, NNZ: Any, R: Any) -> Any:
        return T.floordiv(count(TO, Off, vt, vb, NB, NNZ, R) + (U - 1), U)

    def index(I: Any, Off: Any, vt: Any, vb: Any, NB: Any, vl: Any) -> Any:
        return T.Cast(i64, I[start(Off, vt, vb, NB) + vl])

    def row(W: Any, S: Any, TO: Any, I: Any, Off: Any, vt: Any, vb: Any, NB: Any, vl: Any, vd: Any) -> Any:
        """Element vd of the bag's vl-th row, a guarded load: an index out of its table is never read."""
        idx = index(I, Off, vt, vb, NB, vl)
        if branch:  # the branch around the row guards it
            return fmt.load(W, S, TO[vt] + idx, vd, bias=not split)
        return T.if_then_else(in_range(idx, rows_of(TO, vt)), fmt.load(W, S, TO[vt] + idx, vd, bias=not split),
                              T.float32(identity))

    def row_bias(S: Any, TO: Any, I: Any, Off: Any, vt: Any, vb: Any, NB: Any, vl: Any) -> Any:
        """The bag's vl-th row's bias (split), guarded as `row`."""
        idx = index(I, Off, vt, vb, NB, vl)
        if branch:
            return fmt.bias_of(S, TO[vt] + idx)
        return T.if_then_else(in_range(idx, rows_of(TO, vt)), fmt.bias_of(S, TO[vt] + idx), T.float32(0))

    def staged_index(TO: Any, I: Any, Off: Any, vt: Any, vb: Any, NB: Any, NNZ: Any, R: Any, vl: Any) -> Any:
        """The bag's vl-th index; past the end, its last one."""
        last = start(Off, vt, vb, NB) + count(TO, Off, vt, vb, NB, NNZ, R) - 1
        return T.Cast(i64, I[T.min(start(Off, vt, vb, NB) + vl, last)])

    def staged_row(W: Any, S: Any, TO: Any, I: Any, Off: Any, vt: Any, vb: Any, NB: Any, NNZ: Any, R: Any, vl: Any,
                   vd: Any) -> Any:
        """Element vd of the bag's vl-th row; past the end, of its last row, pooling as nothing; for an index out
        of its table, of the table's first row, pooling as nothing."""
        idx = staged_index(TO, I, Off, vt, vb, NB, NNZ, R, vl)
        ok = in_range(idx, rows_of(TO, vt))
        value = fmt.load(W, S, TO[vt] + T.Select(ok, idx, T.int64(0)), vd)
        # masked bit by bit: the load stays unconditional (an if_then_else would put it under a branch) and no
        # inf or NaN of the repeated row leaks in (as value * 0 would)
        if mode == "max":  # re-pooling the last row changes no maximum; a bad index's row pools as -inf
            keep = T.Select(ok, T.int32(-1), T.int32(0))
            return T.reinterpret("float32", T.bitwise_or(
                T.bitwise_and(T.reinterpret("int32", value), keep),
                T.bitwise_and(T.bitwise_not(keep), T.int32(NEG_INF_BITS))))
        keep = T.Select(T.And(vl < count(TO, Off, vt, vb, NB, NNZ, R), ok), T.int32(-1), T.int32(0))
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
    def check_bag(TO, Off, Flag, vt, vb, NB, NNZ, R):
        """GPU: flag a bag outside the indices (or a first bag not at 0), a bad table, or indices into an empty
        one (the bag's count is then 0: it pools nothing)."""
        flag_if(Flag, T.Or(not bag_ok(start(Off, vt, vb, NB), end(Off, vt, vb, NB), NNZ),
                           T.And(vt * NB + vb == 0, start(Off, vt, vb, NB) != T.int64(0))), OFFSETS_ERROR)
        flag_if(Flag, T.Or(not table_ok(TO, vt, R), T.And(vt == 0, TO[0] != T.int64(0))), TABLE_OFFSETS_ERROR)
        flag_if(Flag, T.And(rows_of(TO, vt) == T.int64(0),
                            bag_length(start(Off, vt, vb, NB), end(Off, vt, vb, NB), NNZ) > T.int64(0)), INDEX_ERROR)

    def lanes(n: int) -> Any:
        return T.vectorized(n) if n > 1 else T.serial(n)

    def rows_in(name: str) -> Any:
        """CPU: a macro `pool_row(W, S, TO, I, Off, A, O, Flag, vt, vb, l, NB, NNZ, R)`, row l of bag (vt, vb) (l < its
        count): its prefetch, check and add in block `name` (one macro per name, as embedding_bag's)."""

        @T.macro
        def add_row(W, S, TO, I, Off, A, O, vt, vb, l, NB, NNZ, R):
            for dm in T.unroll(D // vector):
                for dv in lanes(vector):
                    with T.sblock(name):
                        vl = T.axis.reduce(count(TO, Off, vt, vb, NB, NNZ, R), l)
                        vd = T.axis.spatial(D, dm * vector + dv)
                        if direct:
                            O[vb, vt * D + vd] = combine(O[vb, vt * D + vd], row(W, S, TO, I, Off, vt, vb, NB, vl, vd))
                        else:
                            A[vd] = combine(A[vd], row(W, S, TO, I, Off, vt, vb, NB, vl, vd))
            if split:
                with T.sblock(name + "_bias"):
                    vl = T.axis.reduce(count(TO, Off, vt, vb, NB, NNZ, R), l)
                    A[D] = A[D] + row_bias(S, TO, I, Off, vt, vb, NB, vl)

        @T.macro
        def pool_row(W, S, TO, I, Off, A, O, Flag, vt, vb, l, NB, NNZ, R):
            if prefetch > 0:
                # clamped, not guarded: no branch in the loop; the tail re-prefetches the last row. Near a table's
                # end the guess uses this table's base: a wasted prefetch, never a fault.
                prefetch_row(W, T.min(TO[vt] + T.Cast(i64, I[T.min(start(Off, vt, vb, NB) + l + prefetch, NNZ - 1)]),
                                      R - 1))
            if branch:
                if in_range(index(I, Off, vt, vb, NB, l), rows_of(TO, vt)):
                    add_row(W, S, TO, I, Off, A, O, vt, vb, l, NB, NNZ, R)
                else:
                    flag_if(Flag, True, INDEX_ERROR)
            else:
                flag_if(Flag, not in_range(index(I, Off, vt, vb, NB, l), rows_of(TO, vt)), INDEX_ERROR)
                add_row(W, S, TO, I, Off, A, O, vt, vb, l, NB, NNZ, R)

        return pool_row

    group_row, tail_row = rows_in("acc"), rows_in("acc_tail")

    @T.macro
    def pool(W, S, TO, I, Off, A, O, Flag, vt, vb, NB, NNZ, R):
        """CPU: reduce bag (vt, vb)'s rows into A[0:D] (or straight into its output row when `direct`), in one
        block: its only writer seen from the bag (see embedding_bag's)."""
        with T.sblock("pool"):
            T.reads(Off[vt * NB + vb:vt * NB + vb + 2], TO[vt:vt + 2], I[0:NNZ], W[0:R, 0:WD])
            if direct:
                T.writes(O[vb, vt * D:vt * D + D])
            else:
                T.writes(A[0:AW])
            for d0 in range(D):
                with T.sblock("acc_init"):
                    vd0 = T.axis.spatial(D, d0)
                    if direct:
                        O[vb, vt * D + vd0] = T.float32(identity)
                    else:
                        A[vd0] = T.float32(identity)
            if split:
                with T.sblock("bias_init"):
                    A[D] = T.float32(0)
            if unroll == 1:
                for l in range(count(TO, Off, vt, vb, NB, NNZ, R)):
                    group_row(W, S, TO, I, Off, A, O, Flag, vt, vb, l, NB, NNZ, R)
            else:
                for g in range(count(TO, Off, vt, vb, NB, NNZ, R) // unroll):
                    for u in T.unroll(T.int64(unroll)):
                        group_row(W, S, TO, I, Off, A, O, Flag, vt, vb, g * unroll + u, NB, NNZ, R)
                for r in range(count(TO, Off, vt, vb, NB, NNZ, R) % unroll):
                    tail_row(W, S, TO, I, Off, A, O, Flag, vt, vb,
                             count(TO, Off, vt, vb, NB, NNZ, R) // unroll * unroll + r, NB, NNZ, R)

    @T.macro
    def pool_staged(W, S, TO, I, Off, A, G, Flag, vt, vb, NB, NNZ, R):
        """Reduce bag (vt, vb)'s rows into A[0:D], U rows per step through the stage G[0:U, 0:D]."""
        for s in range(steps(TO, Off, vt, vb, NB, NNZ, R)):
            for u in range(U):
                with T.sblock("check"):
                    vs = T.axis.opaque(steps(TO, Off, vt, vb, NB, NNZ, R), s)
                    vu = T.axis.opaque(U, u)
                    T.reads()
                    T.writes(Flag[0])
                    if not in_range(staged_index(TO, I, Off, vt, vb, NB, NNZ, R, vs * U + vu), rows_of(TO, vt)):
                        Flag[0] = T.bitwise_or(Flag[0], T.int32(INDEX_ERROR))
            for u, d in T.grid(U, D):
                with T.sblock("gather"):
                    vs = T.axis.spatial(steps(TO, Off, vt, vb, NB, NNZ, R), s)
                    vu = T.axis.spatial(U, u)
                    vd = T.axis.spatial(D, d)
                    G[vu, vd] = staged_row(W, S, TO, I, Off, vt, vb, NB, NNZ, R, vs * U + vu, vd)
            for u, d in T.grid(U, D):
                with T.sblock("acc"):
                    vs = T.axis.reduce(steps(TO, Off, vt, vb, NB, NNZ, R), s)
                    vu = T.axis.reduce(U, u)
                    vd = T.axis.spatial(D, d)
                    with T.init():
                        A[vd] = T.float32(identity)
                    A[vd] = combine(A[vd], G[vu, vd])

    @T.macro
    def finalize(TO, Off, A, O, vt, vb, NB, NNZ, R):
        """Bag (vt, vb)'s output row from its scratch A (and the rows' biases' column, split)."""
        for d2 in range(D):
            with T.sblock("finalize"):
                vd2 = T.axis.spatial(D, d2)
                if split:
                    O[vb, vt * D + vd2] = finish(A[vd2] + A[D], count(TO, Off, vt, vb, NB, NNZ, R))
                else:
                    O[vb, vt * D + vd2] = finish(A[vd2], count(TO, Off, vt, vb, NB, NNZ, R))

    @T.macro
    def bags(W, S, TO, I, Off, O, Flag, NB, NNZ, R):
        for t, b in T.grid(NT, NB):
            with T.sblock("bag"):
                vt = T.axis.spatial(NT, t)
                vb = T.axis.spatial(NB, b)
                T.reads(Off[vt * NB + vb:vt * NB + vb + 2], TO[vt:vt + 2], I[0:NNZ], W[0:R, 0:WD])
                T.writes(O[vb, vt * D:vt * D + D])  # and the flag (a benign race: not a region the schedule orders)
                if gpu:
                    check_bag(TO, Off, Flag, vt, vb, NB, NNZ, R)
                if direct:
                    pool(W, S, TO, I, Off, O, O, Flag, vt, vb, NB, NNZ, R)  # A unused: O stands in to type-check
                else:
                    A = T.sblock_alloc_buffer((AW,), "float32", scope="local" if gpu else SCRATCH_SCOPE)
                    if gpu:
                        G = T.sblock_alloc_buffer((U, D), "float32", scope="local")
                        pool_staged(W, S, TO, I, Off, A, G, Flag, vt, vb, NB, NNZ, R)
                    else:
                        pool(W, S, TO, I, Off, A, O, Flag, vt, vb, NB, NNZ, R)
                    finalize(TO, Off, A, O, vt, vb, NB, NNZ, R)

    @T.macro
    def first_pair(Off, at, work, NB):
        """at[0] := the first (table, bag) pair p, table-major, with Off[p] + p >= work (the indices and bags
        before it: the work done before it), by bisection over the offsets (which rise: checked before)."""
        at[0] = T.int64(0)
        at[1] = T.int64(NT) * NB
        while at[0] < at[1]:
            if T.Cast(i64, Off[(at[0] + at[1]) // 2]) + (at[0] + at[1]) // 2 < work:
                at[0] = (at[0] + at[1]) // 2 + 1
            else:
                at[1] = (at[0] + at[1]) // 2

    @T.macro
    def even_bags(W, S, TO, I, Off, O, Flag, NB, NNZ, R):
        """CPU: the pairs table-major (the order of the indices, which the prefetch reads ahead in) cut into
        `runs` runs of equal work, each an index or a bag; the runs spread over the cores."""
        for c in T.parallel(runs):
            with T.sblock("run"):
                vc = T.axis.spatial(runs, c)
                T.reads(Off[0:NT * NB + 1], TO[0:NT + 1], I[0:NNZ], W[0:R, 0:WD])
                T.writes(O[0:NB, 0:NT * D])
                first = T.sblock_alloc_buffer((2,), "int64", scope="local")
                end = T.sblock_alloc_buffer((2,), "int64", scope="local")
                A = T.sblock_alloc_buffer((AW,), "float32", scope=SCRATCH_SCOPE)
                first_pair(Off, first, vc * (NNZ + NT * NB) // runs, NB)
                first_pair(Off, end, (vc + 1) * (NNZ + NT * NB) // runs, NB)
                for p in T.serial(first[0], end[0]):
                    with T.sblock("bag"):
                        vp = T.axis.opaque(NT * NB, p)
                        T.reads(Off[0:NT * NB + 1], TO[0:NT + 1], I[0:NNZ], W[0:R, 0:WD])
                        T.writes(O[vp % NB, vp // NB * D:vp // NB * D + D])
                        pool(W, S, TO, I, Off, A, O, Flag, vp // NB, vp % NB, NB, NNZ, R)
                        finalize(TO, Off, A, O, vp // NB, vp % NB, NB, NNZ, R)

    @T.macro
    def kernel(W, S, TO, I, Off, O, Flag, NB, NNZ, R):
        if gpu:
            bags(W, S, TO, I, Off, O, Flag, NB, NNZ, R)
        else:
            check_boundaries(TO, Flag, NT + 1, R, TABLE_OFFSETS_ERROR)
            check_boundaries(Off, Flag, NT * NB + 1, NNZ, OFFSETS_ERROR)
            if T.bitwise_and(Flag[0], T.int32(OFFSETS_ERROR | TABLE_OFFSETS_ERROR)) == T.int32(0):
                if even:
                    even_bags(W, S, TO, I, Off, O, Flag, NB, NNZ, R)
                else:
                    bags(W, S, TO, I, Off, O, Flag, NB, NNZ, R)
            else:  # flagged: zeros, not whatever the output's memory held
                for b, d in T.grid(NB, NT * D):
                    with T.sblock("zero"):
                        vb, vd = T.axis.remap("SS", [b, d])
                        O[vb, vd] = T.float32(0)

    @T.prim_func(s_tir=True)
    def main(w_: T.handle, toff: T.handle, ind: T.handle, off: T.handle, out: T.handle, flag: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        R = T.int64()
        NNZ = T.int64()
        NB = T.int64()
        W = T.match_buffer(w_, (R, WD), fmt.storage)
        TO = T.match_buffer(toff, (NT + 1,), "int64", align=8)
        I = T.match_buffer(ind, (NNZ,), idt, align=ialign)
        O = T.match_buffer(out, (NB, NT * D), "float32")
        Off = T.match_buffer(off, (NT * NB + 1,), idt, align=ialign)
        Flag = T.match_buffer(flag, (1,), "int32")
        if fmt.fused:
            S = fmt.scales(W)
            kernel(W, S, TO, I, Off, O, Flag, NB, NNZ, R)
        else:
            kernel(W, W, TO, I, Off, O, Flag, NB, NNZ, R)  # S unused: the table stands in

    return tvm.IRModule({"main": main})
