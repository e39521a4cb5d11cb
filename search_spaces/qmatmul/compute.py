"""The TE definition of quantized matmul both devices schedule: the reduction `C` and the fused epilogue `Y`
over a packed weight whose layout the device's config chooses, and optionally Y's row quantization for the
next int8 layer (`amax`, `S`, `Q`: what qmatmul_requant computes)."""

from __future__ import annotations

from typing import Any, Callable

from ..quantize_rows.quotient import exact_quotient
from ..quantize_rows.workload import EPS, QMAX as INT8_QMAX
from .workload import Workload

# (kp, np_) -> the packed weight's placeholder and W[n, k] expressed on it
PackedWeight = Callable[[int, int], tuple[Any, Callable[[Any, Any], Any]]]


def define(w: Workload, dims: tuple[int, int, int], packed_weight: PackedWeight, unsigned_offset: int = 0,
           out_qmax: int = 0, fma_quotient: bool = False, params: tuple[Any, ...] = ()) -> Any:
    """The IRModule over padded `dims` (mp, kp, np_); argument order (A, Wp, [comp], a_scale?, w_scale, [bias], Y),
    or with `out_qmax` (A, ..., [bias], Q, S), then `params` (scalar variables mp may be an expression of: a CPU
    kernel's number of tasks).

    `unsigned_offset` (u8 x s8 instructions): int8 activations enter the reduction as unsigned A + offset (`Au`),
    and the per-channel compensation `comp` = offset * sum_k W[n, k] (computed at packing time) is subtracted
    before the epilogue. `out_qmax` > 0: Y is an intermediate, quantized per row as quantize_rows does
    (`amax` over the padded row: padded channels are exactly 0; `S` = max(amax, eps) / qmax; `Q` = Y / S
    rounded half to even and clamped; `out_qmax` 255: uint8 rows in [0, 255] of a ReLU's output), so the next
    layer's activations never exist in float32 outside a task. Mode uint8: A enters the reduction as it is.
    `fma_quotient` (CPUs): Y / S from the row's reciprocal `R` and two FMAs, the division's bits at a fraction
    of its cost (quantize_rows/quotient.py)."""
    import tvm
    from tvm import te

    mp, kp, np_ = dims
    int8 = w.mode in ("int8", "uint8")
    A = te.placeholder((mp, kp), {"int8": "int8", "uint8": "uint8"}.get(w.mode, "float32"), name="A")
    Wp, weight = packed_weight(kp, np_)
    w_scale = te.placeholder((np_,), "float32", name="w_scale")
    args = [A, Wp]
    k = te.reduce_axis((0, kp), name="k")
    if int8:
        if unsigned_offset:
            comp = te.placeholder((np_,), "int32", name="comp")
            args.append(comp)
            Au = te.compute((mp, kp), lambda i, j: (A[i, j].astype("int32") + unsigned_offset).astype("uint8"),
                            name="Au")
            src = Au
        else:
            src = A
        acc = te.compute((mp, np_), lambda i, j: te.sum(
            src[i, k].astype("int32") * weight(j, k).astype("int32"), axis=k), name="C")
        a_scale = te.placeholder((mp,), "float32", name="a_scale")
        args += [a_scale, w_scale]

        def value(i: Any, j: Any) -> Any:
            c = acc[i, j] - comp[j] if unsigned_offset else acc[i, j]
            return c.astype("float32") * a_scale[i] * w_scale[j]
    else:
        acc = te.compute((mp, np_), lambda i, j: te.sum(
            A[i, k] * weight(j, k).astype("float32"), axis=k), name="C")
        args.append(w_scale)

        def value(i: Any, j: Any) -> Any:
            return acc[i, j] * w_scale[j]
    if w.bias:
        bias = te.placeholder((np_,), "float32", name="bias")
        args.append(bias)
    epilogue: Callable[[Any, Any], Any] = (lambda i, j: value(i, j) + bias[j]) if w.bias else value
    final = (lambda i, j: te.max(epilogue(i, j), tvm.tirx.const(0, "float32"))) if w.relu else epilogue
    Y = te.compute((mp, np_), final, name="Y")
    if not out_qmax:
        return tvm.IRModule({"main": te.create_prim_func(args + [Y, *params])})
    n = te.reduce_axis((0, np_), name="n")
    amax = te.compute((mp,), lambda i: te.max(te.abs(Y[i, n]), axis=n), name="amax")
    qmax = tvm.tirx.const(float(out_qmax), "float32")
    S = te.compute((mp,), lambda i: te.max(amax[i], tvm.tirx.const(EPS, "float32")) / qmax, name="S")
    if fma_quotient:
        R = te.compute((mp,), lambda i: tvm.tirx.const(1.0, "float32") / S[i], name="R")
        quotient: Callable[[Any, Any], Any] = lambda i, j: exact_quotient(Y[i, j], S[i], R[i])
    else:
        quotient = lambda i, j: Y[i, j] / S[i]
    if out_qmax > INT8_QMAX:  # unsigned rows (Y >= 0 after its ReLU): [0, out_qmax] as uint8
        Q = te.compute((mp, np_), lambda i, j: te.max(te.min(te.round(quotient(i, j)), qmax),
                                                      tvm.tirx.const(0.0, "float32")).astype("uint8"), name="Q")
    else:
        Q = te.compute((mp, np_), lambda i, j: te.max(te.min(te.round(quotient(i, j)), qmax), -qmax).astype("int8"),
                       name="Q")
    return tvm.IRModule({"main": te.create_prim_func(args + [Q, S, *params])})
