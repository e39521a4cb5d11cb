"""Features of a candidate's lowered, scheduled program: what the cost model can compare across operators.

Knob encodings mean something only within one operator's space; the loop nest a config produces (how many
stores, at which vector width, under how much parallelism, touching how many bytes) means the same for every
operator and device. TVM's meta-schedule `PerStoreFeature` gives one 164-number row per buffer store of the
scheduled TIR (most already log2(1 + x)-scaled by TVM, some one-hot); a program has as many rows as stores,
so they are pooled into a fixed set of names: `p.sum.<i>` and `p.max.<i>` over stores, and `p.stores`.

Where that extractor fails on a template's IR, `p.loop.*` features from our own walk of the loop nest stand
in (loop counts and log2 extents per loop kind, vector lanes, loads/stores, nesting depth, trip counts).
TVM is imported only when features are computed: `cost_model` is imported by the tuner's parent process.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from typing import Any

# Bump when the names or the meaning of the values change: records carry it, and `autotune featurize`
# recomputes the features of records that carry another one.
PROGRAM_FEATURES_VERSION = "1"

_LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled", "thread_binding")


def program_features(mod: Any, target: Any) -> dict[str, float]:
    """Named features of a lowered IRModule for a tvm Target; {} only if both extractors fail.

    Values are rounded to 6 significant digits: the extractor computes in float32 anyway, and logs stay
    smaller; the build workers and `Builder.featurize` round alike, so both give the same numbers."""
    for extract in (_per_store, _loop_nest):
        try:
            feats = extract(mod, target)
        except Exception:  # TVM raises many kinds on IR it does not expect; the other extractor may cope
            continue
        if feats:
            return {k: _round(v) for k, v in feats.items()}
    return {}


def _round(v: float) -> float:
    return float(f"{v:.6g}")


def _slog(x: float) -> float:
    """log2(1 + |x|), signed: TVM's own scaling of counts and sizes, so both extractors' numbers look alike."""
    return math.copysign(math.log2(1 + abs(x)), x)


# ---- TVM's per-store features ------------------------------------------------------------------------------
@functools.cache
def _extractor() -> Any:
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature

    return PerStoreFeature()


def _per_store(mod: Any, target: Any) -> dict[str, float]:
    import numpy as np
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    if not isinstance(target, tvm.target.Target):
        target = tvm.target.Target(target)
    # The FFI constructor, not `ms.TuneContext(...)`: the Python class imports tvm.s_tir.tensor_intrin,
    # which takes about a minute, and the extractor reads only the module and the target from the context.
    # Arguments: mod, target, space generator, search strategy, task name, threads, random seed, logger.
    ctx = _ffi_api.TuneContext(mod, target, None, None, "main", 1, -1, None)
    # args_info must be empty: ArgInfo.from_prim_func fails on symbolic shapes, and the extractor ignores it.
    (rows,) = _extractor().extract_from(ctx, [MeasureCandidate(Schedule(mod), [])])
    rows = np.asarray(rows.numpy(), dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise ValueError("no buffer stores found")
    out = {"p.stores": float(rows.shape[0])}
    for i, (s, m) in enumerate(zip(rows.sum(axis=0), rows.max(axis=0))):
        out[f"p.sum.{i}"], out[f"p.max.{i}"] = float(s), float(m)
    if not all(math.isfinite(v) for v in out.values()):
        raise ValueError("non-finite per-store features")
    return out


# ---- our own loop-nest walk (the fallback) -----------------------------------------------------------------
def _lanes(expr: Any) -> int:
    ty = getattr(expr, "ty", None)
    dtype = getattr(ty, "dtype", None) or getattr(expr, "dtype", None)
    lanes = getattr(dtype, "lanes", 1)
    return lanes if isinstance(lanes, int) and lanes > 0 else 1


def _loop_nest(mod: Any, target: Any = None) -> dict[str, float]:
    """Loop-nest features of every PrimFunc of `mod`, from one structural walk that tracks enclosing loops."""
    import tvm
    from tvm_ffi.structural import structural_visit

    For, BufferStore = tvm.tirx.stmt.For, tvm.tirx.stmt.BufferStore
    Load, Call = tvm.ir.expr.TensorLoad, tvm.ir.expr.Call
    kinds = {int(getattr(tvm.tirx.ForKind, k.upper())): k for k in _LOOP_KINDS}
    n: dict[str, float] = defaultdict(float)
    stack: list[tuple[str, int | None]] = []  # enclosing loops: (kind, constant extent or None)
    trips: list[float] = []  # per store: log2 of the trip count of its constant-extent enclosing loops
    inner_vec = [0]

    def on_for(node: Any, visitor: Any) -> Any:
        kind = kinds.get(int(node.kind), "serial")
        extent = getattr(node.extent, "value", None)
        extent = extent if isinstance(extent, int) else None
        n[f"p.loop.n.{kind}"] += 1
        if extent is None:
            n["p.loop.symbolic"] += 1
        else:
            n[f"p.loop.log2_extent.{kind}"] += math.log2(max(extent, 1))
        stack.append((kind, extent))
        n["p.loop.depth"] = max(n["p.loop.depth"], len(stack))
        try:
            return visitor.default_visit(node)
        finally:
            stack.pop()

    def on_store(node: Any, visitor: Any) -> Any:
        n["p.loop.stores"] += 1
        trips.append(sum(math.log2(max(e, 1)) for _, e in stack if e is not None))
        lanes = _lanes(node.value)
        if stack and stack[-1][0] == "vectorized" and stack[-1][1]:
            lanes = max(lanes, stack[-1][1])
        inner_vec[0] = max(inner_vec[0], lanes)
        n["p.loop.symbolic_depth"] = max(n["p.loop.symbolic_depth"], sum(e is None for _, e in stack))
        return visitor.default_visit(node)

    def on_load(node: Any, visitor: Any) -> Any:
        n["p.loop.loads"] += 1
        n["p.loop.vector_loads"] += _lanes(node) > 1
        return visitor.default_visit(node)

    def on_call(node: Any, visitor: Any) -> Any:
        n["p.loop.calls"] += 1
        return visitor.default_visit(node)

    funcs = [f for _, f in mod.functions.items() if hasattr(f, "body")]
    for func in funcs:
        structural_visit(func.body, [(For, on_for), (BufferStore, on_store), (Load, on_load), (Call, on_call)])
    if not n["p.loop.stores"]:
        return {}
    out = {f"p.loop.n.{k}": 0.0 for k in _LOOP_KINDS} | {f"p.loop.log2_extent.{k}": 0.0 for k in _LOOP_KINDS}
    out.update(n)
    out.update({"p.loop.funcs": float(len(funcs)), "p.loop.vector_lanes": float(inner_vec[0]),
                "p.loop.log2_trips.sum": _slog(sum(2.0 ** t for t in trips)),
                "p.loop.log2_trips.max": max(trips)})
    for k in ("symbolic", "vector_loads", "calls", "loads", "symbolic_depth"):
        out.setdefault(f"p.loop.{k}", 0.0)
    return {k: float(v) for k, v in sorted(out.items())}
