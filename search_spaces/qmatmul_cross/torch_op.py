"""`torch.ops.autotune.qmatmul_cross`: DCNv2's cross layer after its low-rank product, `x0 * (a @ W.T * scales +
bias) + x`, in one kernel.

It takes qmatmul's int8 (or uint8) operands, then x0 and x (one row per activation row, both float32 or both
bfloat16: the cross state's dtype, which the output keeps). Kernels are compiled for (k, n, mode, bias, a_bits,
state) and serve any M (whole tasks, as qmatmul's CPU kernels). No gradient (int8 inference)."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional, Sequence

import torch
from torch import Tensor

from .._torch_checks import fits, need, same_device_contiguous
from ..qmatmul.checks import check_operands, op_arguments
from ..qmatmul.torch_op import cases as _qmatmul_cases, mode_of
from ..qmatmul.workload import qmatmul_reference
from ..template import InvalidDtype, Route, TorchBinding
from .workload import Workload, cross, inputs

__all__ = ["BINDING", "check", "qmatmul_cross"]

OP = "qmatmul_cross"


def qmatmul_cross(a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor],
                  x0: Tensor, x: Tensor, a_bits: int = 8, validate: bool = True) -> Tensor:
    """`x0 * qmatmul(a, weight, a_scale, w_scale, bias, a_bits=a_bits) + x`: a DCNv2 cross layer's output from
    its W product's int8 operands, x0 (the cross network's input) and x (the layer's input); bfloat16 x0 and x:
    the tail in float32 from them widened, the output rounded to bfloat16."""
    return cross(qmatmul_reference(a, weight, a_scale, w_scale, bias), x0, x)


def check(a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor], x0: Tensor,
          x: Tensor, a_bits: int = 8, validate: bool = True) -> None:
    """qmatmul's checks of the operands (errors name this op); int8 or uint8 activations; x0 and x (m, n), both
    float32 or both bfloat16, on the operands' device, contiguous."""
    check_operands(OP, a, weight, a_scale, w_scale, bias, a_bits)
    shape = (a.shape[0], weight.shape[0])
    if x0.dtype is x.dtype and x.dtype in _STATES and x0.shape == shape and x.shape == shape \
            and a.dtype is not _F32 and fits(a, x0, x):
        return
    need(a.dtype is not _F32, OP, "a must be int8 or uint8 with a_scale (the cross layer has no weight-only mode)",
         InvalidDtype)
    for name, t in (("x0", x0), ("x", x)):
        need(t.dtype in _STATES, OP, f"{name} must be float32 or bfloat16, got {t.dtype}", InvalidDtype)
        need(tuple(t.shape) == shape, OP, f"{name} must be {shape} (a's rows, weight's rows), got {tuple(t.shape)}")
    need(x0.dtype == x.dtype, OP, f"x0 and x must be of one dtype (the cross state's), got {x0.dtype} and {x.dtype}",
         InvalidDtype)
    same_device_contiguous(OP, a=a, x0=x0, x=x)


_F32 = torch.float32
_STATES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def fake(a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor], x0: Tensor, x: Tensor,
         a_bits: int = 8, validate: bool = True) -> Tensor:
    return x.new_empty(a.shape[0], weight.shape[0])


def route(a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor], x0: Tensor, x: Tensor,
          a_bits: int = 8, validate: bool = True) -> Route:
    n, k = weight.shape
    return Route((k, n, mode_of(a), bias is not None, a_bits, _STATES.get(x.dtype, str(x.dtype))), a.shape[0])


def run(chunks: Sequence[Any], a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor],
        x0: Tensor, x: Tensor, a_bits: int = 8, validate: bool = True) -> Tensor:
    """The whole call through one kernel: a CPU kernel runs any M (qmatmul's `call_dims` pads the rows up to
    whole tasks; padded rows are computed and dropped)."""
    (chunk,) = chunks  # any_size: the registry plans one chunk, the whole call
    per_channel = [w_scale] + ([] if bias is None else [bias])
    return chunk.kernel(a, weight, a_scale, *per_channel, x0, x).contiguous()


def compiled(w: Workload) -> tuple[Any, ...]:
    return (w.k, w.n, w.mode, w.bias, w.a_bits, w.state)


def describe(signature: tuple[Any, ...]) -> str:
    k, n, mode, bias, a_bits, state = signature
    return f"k={k} n={n} mode={mode} bias={bias} a_bits={a_bits} state={state}"


def cases(w: Workload, seed: int, count: int) -> Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """qmatmul's cases (M around the tuned one, extreme and zero operands, random M), each with its own x0 and
    x of the call's rows."""
    for i, (name, args, kwargs) in enumerate(_qmatmul_cases(w, seed, count)):
        m = args[0].shape[0]
        *_, x0, x = inputs(dataclasses.replace(w, m=m), seed + 100 + i)
        yield name, (*args, x0, x), {"a_bits": kwargs["a_bits"]}


def replayable(a: Tensor, weight: Tensor, a_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor], x0: Tensor,
               x: Tensor, a_bits: int = 8, validate: bool = True) -> bool:
    """Unless a validated call promises 7-bit activations: `check` then reads their range."""
    return a_bits == 8 or not validate


def op_call(w: Workload, tensors: Sequence[Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The op's arguments for the template's reference-order tensors of `w`."""
    *operands, x0, x = tensors
    args, kwargs = op_arguments(w, operands)
    return (*args, x0, x), {"a_bits": kwargs["a_bits"]}


BINDING = TorchBinding(
    op=qmatmul_cross, fake=fake, check=check, route=route, run=run, compiled=compiled, size=lambda w: w.m,
    any_size=True, describe=describe, cases=cases, replayable=replayable)
