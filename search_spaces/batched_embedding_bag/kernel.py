"""The table-batched kernel as TVMScript, shared by the CPU and the CUDA schedules (cpu.py, cuda.py).

As in `embedding_bag`, each (table, bag) pair is an opaque block whose reduction runs over
`offsets[g]..offsets[g+1]`, accumulated in a small local buffer and written once. The number of tables, the
dimension, mode and index dtype are compiled in; batch, table sizes and bag sizes are runtime values.
"""

from __future__ import annotations

import math
from typing import Any

from ..embedding_bag.kernel import prefetcher
from ..space import InvalidConfig
from .workload import Workload


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
    identity = -math.inf if mode == "max" else 0.0
    i64 = "int64"
    prefetch_row = prefetcher(prefetch_lines)

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
                # clamped, not guarded: no branch in the loop; the tail re-prefetches the last row. Near a table's
                # end the guess uses this table's base: a wasted prefetch, never a fault.
                prefetch_row(W, T.min(TO[vt] + T.Cast(i64, I[T.min(start(Off, vt, vb, NB) + l + prefetch, NNZ - 1)]),
                                      R - 1))
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

