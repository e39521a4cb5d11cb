"""The CUDA row quantization: its knobs and the schedule of a config.

`threads` threads share a row: each takes a strided slice of it (consecutive threads read consecutive
columns: coalesced), the slices' max |x| are combined by TVM's cross-thread reduction (warp shuffles, and
shared memory between the warps of a row), then every thread divides, rounds and narrows its slice. A block
holds `rows_per_block` rows (threadIdx.y), so narrow rows still fill a block. Rows are symbolic: the grid
follows the call's batch. The division is IEEE (nvcc without --use_fast_math) and `nearbyintf` rounds half to
even, so the result is PyTorch's bit for bit (workload.py).

The row max stays in a register ("local" scope), not in shared memory: TVM's barrier placement misses the
write-by-one-thread, read-by-all of a shared max when rows_per_block > 1 (seen in the generated code), while
its cross-thread reduction leaves the reduced value in every thread of the row (a broadcast shuffle, or
after a barrier).
"""

from __future__ import annotations

from typing import Any

from ..space import Choice, Config, Constraint, InvalidConfig, Space
from .workload import EPS, Workload

THREADS = Choice("threads", (128, 32, 64, 256, 512, 1024), doc=(
    "Threads per row: more threads put more loads of one row in flight and shorten each thread's serial "
    "part of the max; fewer threads per row leave fewer idle lanes on narrow rows and a cheaper reduction "
    "(32: one warp per row, shuffles only, no shared memory or block barrier)."))
ROWS_PER_BLOCK = Choice("rows_per_block", (1, 2, 4, 8, 16), doc=(
    "Rows one block handles at once (threadIdx.y): with few threads per row, several rows per block keep "
    "blocks large enough for the SM's resident-block limit; one row per block gives the most blocks to "
    "spread over the SMs when the batch is small."))

MAX_THREADS = 1024


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def space(w: Workload, target: Any) -> Space:
    """The CUDA knob space: threads beyond the row's width (rounded up to a warp) would idle. No smoothing
    factors and no bfloat16 rows: on GPUs a smoothed layer's input is multiplied before this kernel, and int8
    layers keep float32 activations (qmatmul's graph rule)."""
    if w.smooth:
        raise InvalidConfig("quantize_rows: smoothing factors are fused on CPUs only (smooth=0 on GPUs)")
    if w.dtype != "float32":
        raise InvalidConfig(f"quantize_rows: {w.dtype} rows are read on CPUs only (dtype=float32 on GPUs)")
    threads = [t for t in THREADS.options if t <= max(32, _next_pow2(w.cols))]
    return Space(
        [THREADS.only(threads), ROWS_PER_BLOCK],
        [Constraint(f"threads x rows_per_block must be at most {MAX_THREADS} (a block's limit)",
                    lambda c: c[THREADS] * c[ROWS_PER_BLOCK] <= MAX_THREADS)],
    )


def compute(w: Workload, rows_per_block: int) -> Any:
    """The kernel as TVMScript blocks, rows already grouped rows_per_block at a time (bx, ty).

    The row max lives in a (groups, rows_per_block) buffer indexed by the group and the row within it, so
    its per-block copy has a constant size (a split of the symbolic row loop would leave one of symbolic
    size). Rows past the last (the last group's padding) read the last row and write nothing."""
    import tvm
    from tvm.script import tirx as T

    C, RPB = w.cols, rows_per_block

    @T.prim_func(s_tir=True)
    def main(x_: T.handle, q_: T.handle, s_: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        B = T.int64()
        x = T.match_buffer(x_, (B, C), "float32")
        q = T.match_buffer(q_, (B, C), "int8")
        scale = T.match_buffer(s_, (B,), "float32")
        amax = T.sblock_alloc_buffer(((B + RPB - 1) // RPB, RPB), "float32")
        div = T.sblock_alloc_buffer(((B + RPB - 1) // RPB, RPB), "float32")
        for g, y in T.grid((B + RPB - 1) // RPB, RPB):
            for k in range(C):
                with T.sblock("amax"):
                    vg, vy, vk = T.axis.remap("SSR", [g, y, k])
                    with T.init():
                        amax[vg, vy] = T.min_value("float32")  # the identity of max (cross-thread reducer)
                    amax[vg, vy] = T.max(amax[vg, vy], T.fabs(x[T.min(vg * RPB + vy, B - 1), vk]))
            with T.sblock("div"):
                vg, vy = T.axis.remap("SS", [g, y])
                div[vg, vy] = T.max(amax[vg, vy], T.float32(EPS)) / T.float32(w.qmax)
            with T.sblock("scale"):
                vg, vy = T.axis.remap("SS", [g, y])
                T.where(g * RPB + y < B)
                scale[vg * RPB + vy] = div[vg, vy]
            for c in range(C):
                with T.sblock("q"):
                    vg, vy, vc = T.axis.remap("SSS", [g, y, c])
                    T.where(g * RPB + y < B)
                    q[vg * RPB + vy, vc] = T.Cast("int8", T.max(T.min(T.nearbyint(
                        x[vg * RPB + vy, vc] / div[vg, vy]), T.float32(w.qmax)), T.float32(-w.qmax)))

    return tvm.IRModule({"main": main})


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The scheduled IRModule for one CUDA config."""
    from tvm.s_tir import Schedule

    threads, rpb = cfg[THREADS], cfg[ROWS_PER_BLOCK]
    if threads * rpb > MAX_THREADS:
        raise InvalidConfig(f"threads {threads} x rows_per_block {rpb} exceed {MAX_THREADS} per block")
    sch = Schedule(compute(w, rpb))
    g, y = sch.get_loops(sch.get_sblock("div"))
    sch.bind(g, "blockIdx.x")
    sch.bind(y, "threadIdx.y")
    # the max in a register of every thread of the row; the divisor recomputed from it (nvcc hoists it)
    sch.set_scope(sch.get_sblock("amax"), 0, "local")
    sch.compute_inline(sch.get_sblock("div"))
    for name in ("amax", "q"):  # consecutive threads of a row take consecutive columns: coalesced
        block = sch.get_sblock(name)
        outer, tx = sch.split(sch.get_loops(block)[-1], [None, threads])
        sch.reorder(tx, outer)
        sch.bind(tx, "threadIdx.x")
    return sch.mod
