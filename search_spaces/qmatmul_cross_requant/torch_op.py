"""`torch.ops.autotune.qmatmul_cross_requant`: a DCNv2 cross layer whose output is also the next int8 layer's
input, `y = x0 * (a @ W.T * scales + bias) + x` and `(q, scale) = quantize_rows(y, out_qmax)`, in one kernel.

It takes qmatmul_cross's operands (and `smooth`, the next layer's column factors, where it is smoothed: the rows
of y * smooth are quantized) and returns `(y, q, scale)`; with `out_float=False` (y's only use is the next
layer's quantized input) y is an empty (0, n) tensor and never written. Kernels are compiled for (k, n, mode,
bias, a_bits, out_qmax, out_float, smooth) and their tuned M; other M are padded or split, as qmatmul's. No
gradient (int8 inference)."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch
from torch import Tensor

from .._torch_checks import need, same_device_contiguous
from ..qmatmul.torch_op import mode_of
from ..qmatmul.workload import qmatmul_reference
from ..qmatmul_cross.torch_op import cases as _cross_cases, check_cross, op_call as _cross_call, run_chunk
from ..qmatmul_cross.workload import cross
from ..quantize_rows.workload import QMAX, QMIN, quantize_rows
from ..template import InvalidDtype, Route, TorchBinding
from .workload import Workload, inputs, split

__all__ = ["BINDING", "check", "qmatmul_cross_requant"]

OP = "qmatmul_cross_requant"


def qmatmul_cross_requant(a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor],
                          x0: Tensor, x: Tensor, smooth: Optional[Tensor] = None, a_bits: int = 8,
                          out_qmax: int = QMAX, out_float: bool = True, validate: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """`y = x0 * qmatmul(a, weight, a_scale, w_scale, bias, a_bits=a_bits) + x` and the rows of y (times
    `smooth`, a factor per column, where given) quantized to [-out_qmax, out_qmax]: `(y, q, scale)`, y empty (0
    rows) unless `out_float`."""
    y = cross(qmatmul_reference(a, weight, a_scale, w_scale, bias), x0, x)
    q, scale = quantize_rows(y, out_qmax, smooth)
    return (y if out_float else y.new_empty(0, y.shape[1])), q, scale


def check(a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor], x0: Tensor,
          x: Tensor, smooth: Optional[Tensor] = None, a_bits: int = 8, out_qmax: int = QMAX, out_float: bool = True,
          validate: bool = True) -> None:
    """qmatmul_cross's checks (errors name this op), out_qmax's range, and smooth: float32 (n,) on the
    operands' device, contiguous."""
    check_cross(OP, a, weight, a_scale, w_scale, bias, x0, x, a_bits)
    need(isinstance(out_qmax, int) and not isinstance(out_qmax, bool) and QMIN <= out_qmax <= QMAX, OP,
         lambda: f"out_qmax must be an integer in [{QMIN}, {QMAX}] (a cross layer's output is signed), "
                 f"got {out_qmax!r}")
    if smooth is not None:
        need(smooth.dtype == torch.float32, OP, lambda: f"smooth must be float32, got {smooth.dtype}", InvalidDtype)
        need(tuple(smooth.shape) == (weight.shape[0],), OP,
             lambda: f"smooth must be ({weight.shape[0]},) (a factor per output column), got {tuple(smooth.shape)}")
        same_device_contiguous(OP, a=a, smooth=smooth)


def fake(a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor], x0: Tensor, x: Tensor,
         smooth: Optional[Tensor] = None, a_bits: int = 8, out_qmax: int = QMAX, out_float: bool = True,
         validate: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    m, n = a.shape[0], weight.shape[0]
    return (a.new_empty(m if out_float else 0, n, dtype=torch.float32), a.new_empty(m, n, dtype=torch.int8),
            a.new_empty(m, dtype=torch.float32))


def route(a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor], x0: Tensor, x: Tensor,
          smooth: Optional[Tensor] = None, a_bits: int = 8, out_qmax: int = QMAX, out_float: bool = True,
          validate: bool = True) -> Route:
    n, k = weight.shape
    return Route((k, n, mode_of(a), bias is not None, a_bits, out_qmax, out_float, smooth is not None), a.shape[0])


def run(chunks: Sequence[Any], a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor],
        x0: Tensor, x: Tensor, smooth: Optional[Tensor] = None, a_bits: int = 8, out_qmax: int = QMAX,
        out_float: bool = True, validate: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Each chunk's rows through a kernel tuned for `chunk.kernel.size` rows (qmatmul_cross's `run_chunk`)."""
    n = weight.shape[0]
    after = () if smooth is None else (smooth,)
    if len(chunks) == 1:
        out = tuple(o.contiguous() for o in run_chunk(chunks[0], a, weight, a_scale, w_scale, bias, x0, x, *after))
    else:
        parts = [run_chunk(chunk, a, weight, a_scale, w_scale, bias, x0, x, *after) for chunk in chunks]
        out = tuple(torch.cat(p) for p in zip(*parts))
    return out if out_float else (a.new_empty(0, n, dtype=torch.float32), *out)


def compiled(w: Workload) -> tuple[Any, ...]:
    return (w.k, w.n, w.mode, w.bias, w.a_bits, w.out_qmax, w.out_float, w.smooth)


def describe(signature: tuple[Any, ...]) -> str:
    k, n, mode, bias, a_bits, out_qmax, out_float, smooth = signature
    return (f"k={k} n={n} mode={mode} bias={bias} a_bits={a_bits} out_qmax={out_qmax} out_float={out_float} "
            f"smooth={smooth}")


def cases(w: Workload, seed: int, count: int) -> Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """qmatmul_cross's cases (M around the tuned one, extreme and zero operands, random M), quantized to
    out_qmax (with the workload's column factors, where smoothed)."""
    smooth = inputs(w, seed)[-1] if w.smooth else None
    for name, args, kwargs in _cross_cases(w, seed, count):
        yield name, (*args, smooth), {**kwargs, "out_qmax": w.out_qmax, "out_float": w.out_float}


def replayable(a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor], x0: Tensor,
               x: Tensor, smooth: Optional[Tensor] = None, a_bits: int = 8, out_qmax: int = QMAX,
               out_float: bool = True, validate: bool = True) -> bool:
    """Unless a validated call promises 7-bit activations: `check` then reads their range."""
    return a_bits == 8 or not validate


def op_call(w: Workload, tensors: Sequence[Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The op's arguments for the template's reference-order tensors of `w`."""
    cross, smooth = split(w, tensors)
    args, kwargs = _cross_call(w, cross)
    return (*args, smooth), {**kwargs, "out_qmax": w.out_qmax, "out_float": w.out_float}


BINDING = TorchBinding(
    op=qmatmul_cross_requant, fake=fake, check=check, route=route, run=run, compiled=compiled,
    size=lambda w: w.m, any_size=False, describe=describe, cases=cases, replayable=replayable)
