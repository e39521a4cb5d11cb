"""`torch.ops.autotune.split_linear_cross`: DCNv2's cross layer after its low-rank product, `x0 * (x @ W.T + b) +
x_l`, in one kernel at float32 accuracy.

Kernels are compiled for (k, n, bias) and take any number of rows. The weight is split and packed once per kernel
and weight tensor, as split_linear's. The op has its gradient, so a rewritten model still trains.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .._torch_checks import need, same_device_contiguous
from ..split_linear.checks import check_inputs as check_linear_inputs, check_operands
from ..split_linear.torch_op import cases as _linear_cases
from ..template import InvalidDtype, Route, TorchBinding
from .workload import Workload, cross, inputs

__all__ = ["BINDING", "check", "check_inputs", "split_linear_cross"]

OP = "split_linear_cross"


def split_linear_cross(x: Tensor, weight: Tensor, bias: Optional[Tensor], x0: Tensor, residual: Tensor,
                       validate: bool = True) -> Tensor:
    """`x0 * (x @ weight.T + bias) + residual` for x (M, K), weight (N, K), bias (N,), x0 and residual (M, N),
    float32, with float32's accuracy: a DCNv2 cross layer's output from its W product's input, x0 (the cross
    network's input) and residual (the layer's input)."""
    return cross(F.linear(x, weight, bias), x0, residual)


def check(x: Tensor, weight: Tensor, bias: Optional[Tensor], x0: Tensor, residual: Tensor,
          validate: bool = True) -> None:
    """split_linear's checks of x, the weight and the bias; x0 and residual float32 (M, N) on x's device,
    contiguous."""
    check_operands(OP, x, weight, bias)
    _check_tail(x, weight, x0, residual)


def _check_tail(x: Tensor, weight: Tensor, x0: Tensor, residual: Tensor) -> None:
    shape = (x.shape[0], weight.shape[0])
    if (x0.dtype is _F32 and residual.dtype is _F32 and x0.shape == shape and residual.shape == shape
            and x0.device == x.device == residual.device and x0.is_contiguous() and residual.is_contiguous()):
        return
    for name, t in (("x0", x0), ("residual", residual)):
        need(t.dtype == _F32, OP, f"{name} must be float32, got {t.dtype}", InvalidDtype)
        need(tuple(t.shape) == shape, OP, f"{name} must be {shape} (x's rows, weight's rows), got {tuple(t.shape)}")
    same_device_contiguous(OP, x=x, x0=x0, residual=residual)


_F32 = torch.float32


def check_inputs(w: Workload, *tensors: Any) -> None:
    """What this workload's kernel needs (split_linear's checks of x, the weight and the bias), then x0's and
    residual's."""
    if len(tensors) < 4 or not all(isinstance(t, torch.Tensor) for t in tensors[-2:]):
        raise InvalidDtype(f"{OP}: expected split_linear's tensors, then x0 and residual (tensors)")
    *operands, x0, residual = tensors
    check_linear_inputs(w, *operands, op=OP)
    _check_tail(operands[0], operands[1], x0, residual)


def fake(x: Tensor, weight: Tensor, bias: Optional[Tensor], x0: Tensor, residual: Tensor,
         validate: bool = True) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def route(x: Tensor, weight: Tensor, bias: Optional[Tensor], x0: Tensor, residual: Tensor,
          validate: bool = True) -> Route | str:
    if x.dim() != 2 or weight.dim() != 2:  # validate=False skips check: no shape to index otherwise
        return f"x and weight must be 2-D, got shapes {tuple(x.shape)} and {tuple(weight.shape)}"
    if x.device.type != "cpu":
        return "split_linear_cross runs on CPUs only"
    if not all(t.dtype == _F32 and t.is_contiguous() for t in (x, x0, residual)) or weight.dtype != _F32:
        return "kernels take contiguous float32 x, x0 and residual and a float32 weight"
    n, k = weight.shape
    return Route((k, n, bias is not None), x.shape[0])


def run(chunks: Sequence[Any], x: Tensor, weight: Tensor, bias: Optional[Tensor], x0: Tensor, residual: Tensor,
        validate: bool = True) -> Tensor:
    operands = (x, weight) if bias is None else (x, weight, bias)
    return chunks[0].kernel(*operands, x0, residual)


def compiled(w: Workload) -> tuple[Any, ...]:
    return (w.k, w.n, w.bias)


def describe(signature: tuple[Any, ...]) -> str:
    k, n, bias = signature
    return f"k={k} n={n} bias={bias}"


def cases(w: Workload, seed: int, count: int) -> Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """split_linear's cases (M around the tuned one, zero, signed, huge and tiny activations, products that cancel,
    random M), each with its own x0 and residual of the call's rows."""
    for i, (name, args, _) in enumerate(_linear_cases(w, seed, count)):
        m = args[0].shape[0]
        *_, x0, residual = inputs(dataclasses.replace(w, m=m), seed + 100 + i)
        yield name, (*args[:3], x0, residual), {}


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, weight, bias, x0, _, _ = inputs
    ctx.save_for_backward(x, weight, bias, x0)


def _backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    """out = x0 * (x W^T + b) + residual: the product's gradient is grad * x0 (Linear's backward on it); x0's is
    grad times the product (recomputed: it never existed in memory); residual's is grad."""
    x, weight, bias, x0 = ctx.saved_tensors
    g = grad * x0
    need_x, need_w, need_b, need_x0, need_r, _ = ctx.needs_input_grad
    return (g @ weight if need_x else None, g.T @ x if need_w else None,
            g.sum(0) if bias is not None and need_b else None,
            grad * F.linear(x, weight, bias) if need_x0 else None, grad if need_r else None, None)


BINDING = TorchBinding(
    op=split_linear_cross, fake=fake, check=check, route=route, run=run, compiled=compiled, size=lambda w: w.m,
    any_size=True, describe=describe, cases=cases, replayable=True,  # `check` reads metadata only
    backward=_backward, setup_context=_setup_context)
