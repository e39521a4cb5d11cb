"""The CPU ("llvm") row quantization: its knobs, the kernel as TVMScript, and the schedule of a config.

Each row is read twice: a max |x| pass (vector accumulators, folded into one scalar at the end), then the
quantizing pass, which reads the row again from L1 (a row of a few KB stays there) and writes q. Columns are
compiled in (whole vectors, then a scalar tail for ragged widths); rows are symbolic, so one kernel serves any
batch. The quotient must equal PyTorch's x / scale in the last bit (workload.py): it is the division's own bits,
computed from the row's reciprocal with two FMAs (quotient.py), a fraction of a vector division's cost. Rounding is
`T.round`, which TVM lowers to `llvm.nearbyint` on this target (half to even, as torch.round; one vroundps per
vector): `T.nearbyint`, the same operation, is not vectorizable in TVM's VectorizeLoop, which turns the whole
quantizing loop back into scalar code (LLVM then re-vectorizes it across vectors with strided shuffles: 2-3x
slower, measured).
"""

from __future__ import annotations

import functools
from typing import Any

from ..space import Choice, Config, Constraint, InvalidConfig, Space
from .quotient import exact_quotient
from .workload import EPS, Workload

# ---- knobs --------------------------------------------------------------------------------------------
THREADING = Choice("threading", ("parallel", "serial"), doc=(
    "Rows are independent, so they spread over cores; at a few hundred KB per call the parallel region's "
    "launch and a busy core's imbalance can cost more than the second core brings."))
ROWS_PER_TASK = Choice("rows_per_task", (16, 1, 2, 4, 8, 32, 64, 128), doc=(
    "Rows one parallel task handles in a row: larger tasks amortise the task loop and keep each thread's "
    "reads and writes contiguous; smaller ones balance load when the batch is small."))
LANES = Choice("lanes", (8, 16, 4), doc=(
    "SIMD lanes of both passes (8 fp32 = one AVX2 register, 16 = one AVX-512 register or two AVX2 ones, 4 = "
    "SSE). The last cols % lanes columns of a row run as scalar code, so wide vectors cost ragged rows more."))
MAX_CHAINS = Choice("max_chains", (2, 1, 4, 8), doc=(
    "Independent accumulator vectors of the max |x| pass: one chain waits for each vmaxps's latency, several "
    "keep the loads and maxes in flight. Folded together once per row."))
QUANT_UNROLL = Choice("quant_unroll", (2, 1, 4), doc=(
    "Unroll of the quantizing pass over vectors: independent quotients (a multiply and two dependent FMAs "
    "each) overlap, against code size. Must divide the row's whole vectors."))


def _require_cpu(target: Any) -> None:
    if target.kind.name != "llvm":
        raise InvalidConfig(f"quantize_rows has no CPU schedule for target kind {target.kind.name!r}")


def _vectors(w: Workload, lanes: int) -> int:
    return w.cols // lanes


def space(w: Workload, target: Any) -> Space:
    """The CPU knob space of this workload: lanes wider than the row are useless (all scalar tail)."""
    _require_cpu(target)
    lanes = [v for v in LANES.options if v <= max(4, w.cols)]
    return Space(
        [THREADING, ROWS_PER_TASK, LANES.only(lanes), MAX_CHAINS, QUANT_UNROLL],
        [Constraint("rows_per_task only matters for parallel threading",
                    lambda c: c[THREADING] == "parallel" or c[ROWS_PER_TASK] == ROWS_PER_TASK.options[0]),
         Constraint("quant_unroll must divide the row's whole vectors (cols // lanes)",
                    lambda c: _vectors(w, c[LANES]) % c[QUANT_UNROLL] == 0),
         Constraint("max_chains beyond the row's whole vectors compute nothing",
                    lambda c: c[MAX_CHAINS] == 1 or c[MAX_CHAINS] <= _vectors(w, c[LANES]))],
    )


# ---- the computation ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def compute(w: Workload, lanes: int = 8, max_chains: int = 2, quant_unroll: int = 2) -> Any:
    """The kernel as TVMScript for one vector width, number of max chains and unroll (cached: parsing takes
    a few hundred ms and schedules never mutate their input module)."""
    import tvm
    from tvm.script import tirx as T

    if lanes & (lanes - 1) or lanes < 2:
        raise InvalidConfig(f"lanes must be a power of two >= 2, got {lanes}")
    C, VL, NA = w.cols, lanes, max_chains
    NV = C // VL  # whole vectors of a row
    TAIL = C - NV * VL  # scalar columns after them (< VL)
    NC = NV // NA  # rounds of NA vectors in the max pass
    NREM = NV - NC * NA  # vectors left after them (< NA)
    if quant_unroll < 1 or (NV and NV % quant_unroll):
        raise InvalidConfig(f"quant_unroll {quant_unroll} does not divide the {NV} vectors of a row")
    QU = quant_unroll
    NQ = NV // QU

    def value(x: Any, c: Any, vr: Any, col: Any) -> Any:
        """x[vr, col] as float32 (bfloat16 widened, exact), times its column's factor where the workload smooths
        (rounded as PyTorch's multiply)."""
        v = x[vr, col] if w.dtype == "float32" else T.Cast("float32", x[vr, col])
        return v if c is None else v * c[col]

    def read(x: Any, c: Any, vr: Any) -> list[Any]:
        return [x[vr, 0:C]] + ([] if c is None else [c[0:C]])

    @T.macro
    def rows(x, c, q, scale, B):
        for r in range(B):
            with T.sblock("row"):
                vr = T.axis.spatial(B, r)
                T.reads(read(x, c, vr))
                T.writes(q[vr, 0:C], scale[vr])
                acc = T.sblock_alloc_buffer((NA * VL,), "float32")
                s = T.sblock_alloc_buffer((2,), "float32")  # the scale and its reciprocal
                for a in T.unroll(NA):
                    for l in T.vectorized(VL):
                        acc[a * VL + l] = T.float32(0)
                if NC > 0:
                    for k in range(NC):
                        for a in T.unroll(NA):
                            for l in T.vectorized(VL):
                                acc[a * VL + l] = T.max(acc[a * VL + l],
                                                        T.fabs(value(x, c, vr, (k * NA + a) * VL + l)))
                if NREM > 0:
                    for v in T.unroll(NREM):
                        for l in T.vectorized(VL):
                            acc[v * VL + l] = T.max(acc[v * VL + l],
                                                    T.fabs(value(x, c, vr, (NC * NA + v) * VL + l)))
                if TAIL > 0:
                    for t in T.unroll(TAIL):
                        acc[t] = T.max(acc[t], T.fabs(value(x, c, vr, NV * VL + t)))
                if NA > 1:
                    for a in T.unroll(NA - 1):
                        for l in T.vectorized(VL):
                            acc[l] = T.max(acc[l], acc[(a + 1) * VL + l])
                # cross-lane max by halving: acc[0:h] = max(acc[0:h], acc[h:2h]) for h = VL/2 .. 1
                if VL > 8:
                    for l in T.vectorized(8):
                        acc[l] = T.max(acc[l], acc[8 + l])
                if VL > 4:
                    for l in T.vectorized(4):
                        acc[l] = T.max(acc[l], acc[4 + l])
                for l in T.vectorized(2):
                    acc[l] = T.max(acc[l], acc[2 + l])
                s[0] = T.max(T.max(acc[0], acc[1]), T.float32(EPS)) / T.float32(w.qmax)
                s[1] = T.float32(1) / s[0]
                scale[vr] = s[0]
                if NV > 0:
                    for v0 in range(NQ):
                        for v1 in T.unroll(QU):
                            for l in T.vectorized(VL):
                                q[vr, (v0 * QU + v1) * VL + l] = T.Cast("int8", T.max(T.min(T.round(exact_quotient(
                                    value(x, c, vr, (v0 * QU + v1) * VL + l), s[0], s[1])), T.float32(w.qmax)),
                                    T.float32(-w.qmax)))
                if TAIL > 0:
                    for t in T.unroll(TAIL):
                        q[vr, NV * VL + t] = T.Cast("int8", T.max(T.min(T.round(
                            exact_quotient(value(x, c, vr, NV * VL + t), s[0], s[1])), T.float32(w.qmax)),
                            T.float32(-w.qmax)))

    if w.smooth:
        @T.prim_func(s_tir=True)
        def main(x_: T.handle, c_: T.handle, q_: T.handle, s_: T.handle):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            B = T.int64()
            x = T.match_buffer(x_, (B, C), w.dtype)
            c = T.match_buffer(c_, (C,), "float32")
            q = T.match_buffer(q_, (B, C), "int8")
            scale = T.match_buffer(s_, (B,), "float32")
            rows(x, c, q, scale, B)
    else:
        @T.prim_func(s_tir=True)
        def main(x_: T.handle, q_: T.handle, s_: T.handle):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            B = T.int64()
            x = T.match_buffer(x_, (B, C), w.dtype)
            q = T.match_buffer(q_, (B, C), "int8")
            scale = T.match_buffer(s_, (B,), "float32")
            rows(x, None, q, scale, B)

    return tvm.IRModule({"main": main})


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The scheduled IRModule for one CPU config: rows split into tasks spread over the cores."""
    from tvm.s_tir import Schedule

    _require_cpu(target)
    sch = Schedule(compute(w, cfg[LANES], cfg[MAX_CHAINS], cfg[QUANT_UNROLL]))
    if cfg[THREADING] == "parallel":
        (r,) = sch.get_loops(sch.get_sblock("row"))
        outer, _ = sch.split(r, [None, cfg[ROWS_PER_TASK]])
        sch.parallel(outer)
    return sch.mod
