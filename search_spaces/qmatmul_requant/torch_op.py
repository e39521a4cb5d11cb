"""`torch.ops.autotune.qmatmul_requant`: a quantized matmul whose output is the next int8 layer's input.

It takes qmatmul's operands (int8 activations with a_scale, or float32 ones for weight-only) and returns
`(q, scale)` as `quantize_rows(qmatmul(...), out_qmax)` would, from one kernel. Kernels are compiled for
(k, n, mode, bias, relu, a_bits, out_qmax); CPU kernels serve any M, GPU kernels their tuned M (other M padded
or split), as qmatmul's.
No gradient (int8 inference)."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch
from torch import Tensor

from .._torch_checks import need
from ..qmatmul.checks import check_operands
from ..qmatmul.torch_op import any_size_on, cases as _qmatmul_cases, mode_of, replayable, run_chunk
from ..qmatmul.workload import qmatmul_reference
from ..quantize_rows.workload import QMAX, QMIN
from ..template import Route, TorchBinding
from .workload import UNSIGNED_QMAX, Workload, quantize_output

__all__ = ["BINDING", "qmatmul_requant"]

OP = "qmatmul_requant"


def qmatmul_requant(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor,
                    bias: Optional[Tensor] = None, relu: bool = False, a_bits: int = 8, out_qmax: int = QMAX,
                    validate: bool = True) -> tuple[Tensor, Tensor]:
    """`quantize_rows(qmatmul(a, weight, a_scale, w_scale, bias, relu, a_bits), out_qmax)`: the int8 rows
    (in [-out_qmax, out_qmax]; out_qmax 255 after a ReLU: uint8 rows in [0, 255]) and per-row scales of the
    layer's output, which never exists in float32."""
    return quantize_output(qmatmul_reference(a, weight, a_scale, w_scale, bias, relu), out_qmax)


def check(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor, bias: Optional[Tensor] = None,
          relu: bool = False, a_bits: int = 8, out_qmax: int = QMAX, validate: bool = True) -> None:
    """qmatmul's checks of the operands (errors name this op), and out_qmax's range."""
    check_operands(OP, a, weight, a_scale, w_scale, bias, a_bits)
    need(isinstance(out_qmax, int) and not isinstance(out_qmax, bool)
         and (QMIN <= out_qmax <= QMAX or out_qmax == UNSIGNED_QMAX), OP,
         lambda: f"out_qmax must be an integer in [{QMIN}, {QMAX}], or {UNSIGNED_QMAX} (uint8 rows), got {out_qmax!r}")
    need(out_qmax != UNSIGNED_QMAX or relu, OP, f"out_qmax {UNSIGNED_QMAX} (uint8 rows) needs relu=True")


def fake(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor, bias: Optional[Tensor] = None,
         relu: bool = False, a_bits: int = 8, out_qmax: int = QMAX, validate: bool = True) -> tuple[Tensor, Tensor]:
    m, n = a.shape[0], weight.shape[0]
    return a.new_empty(m, n, dtype=_q_dtype(out_qmax)), a.new_empty(m, dtype=torch.float32)


def _q_dtype(out_qmax: int) -> torch.dtype:
    return torch.uint8 if out_qmax == UNSIGNED_QMAX else torch.int8


def route(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor, bias: Optional[Tensor] = None,
          relu: bool = False, a_bits: int = 8, out_qmax: int = QMAX, validate: bool = True) -> Route:
    n, k = weight.shape
    return Route((k, n, mode_of(a), bias is not None, relu, a_bits, out_qmax), a.shape[0])


def run(chunks: Sequence[Any], a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor,
        bias: Optional[Tensor] = None, relu: bool = False, a_bits: int = 8, out_qmax: int = QMAX,
        validate: bool = True) -> tuple[Tensor, Tensor]:
    rest = [w_scale] + ([] if bias is None else [bias])
    if len(chunks) == 1:
        q, scale = run_chunk(chunks[0], a, weight, a_scale, rest)
        return q.contiguous(), scale.contiguous()
    q = a.new_empty(a.shape[0], weight.shape[0], dtype=_q_dtype(out_qmax))
    scale = a.new_empty(a.shape[0], dtype=torch.float32)
    for chunk in chunks:
        q[chunk.start:chunk.stop], scale[chunk.start:chunk.stop] = run_chunk(chunk, a, weight, a_scale, rest)
    return q, scale


def compiled(w: Workload) -> tuple[Any, ...]:
    return (w.k, w.n, w.mode, w.bias, w.relu, w.a_bits, w.out_qmax)


def describe(signature: tuple[Any, ...]) -> str:
    k, n, mode, bias, relu, a_bits, out_qmax = signature
    return f"k={k} n={n} mode={mode} bias={bias} relu={relu} a_bits={a_bits} out_qmax={out_qmax}"


def cases(w: Workload, seed: int, count: int) -> Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """qmatmul's cases (M around the tuned one, extreme and zero operands, random M), quantized to out_qmax."""
    for name, args, kwargs in _qmatmul_cases(w, seed, count):
        yield name, args, {**kwargs, "out_qmax": w.out_qmax}


BINDING = TorchBinding(
    op=qmatmul_requant, fake=fake, check=check, route=route, run=run, compiled=compiled, size=lambda w: w.m,
    any_size=any_size_on, describe=describe, cases=cases, replayable=replayable)
