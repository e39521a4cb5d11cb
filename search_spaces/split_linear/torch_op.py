"""`torch.ops.autotune.split_linear`: a float32 Linear (+ ReLU) on the tuned kernels, at float32 accuracy.

Kernels are compiled for (k, n, bias, relu) and take any number of rows. The weight is split and packed once per
kernel and weight tensor (an in-place update packs it anew). The op has Linear's backward, so a rewritten model
still trains.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Iterable, Optional, Sequence

import torch
from torch import Tensor

from .._linear_grad import linear_grads, save_linear
from ..template import Route, TorchBinding
from .checks import check
from .workload import Workload, inputs, linear

__all__ = ["BINDING", "split_linear"]


def split_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, relu: bool = False,
                 validate: bool = True) -> Tensor:
    """relu?(x @ weight.T + bias) for x (M, K), weight (N, K), bias (N,), float32, with float32's accuracy (the
    products from bf16 pieces of both on AMX tiles where the CPU has them)."""
    return linear(x, weight, bias, relu)


def fake(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, relu: bool = False,
         validate: bool = True) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def route(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, relu: bool = False,
          validate: bool = True) -> Route | str:
    if x.dim() != 2 or weight.dim() != 2:  # validate=False skips check: no shape to index otherwise
        return f"x and weight must be 2-D, got shapes {tuple(x.shape)} and {tuple(weight.shape)}"
    if x.device.type != "cpu":
        return "split_linear runs on CPUs only"
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or not x.is_contiguous():
        return f"kernels take contiguous float32, got {x.dtype} x and {weight.dtype} weight"
    n, k = weight.shape
    return Route((k, n, bias is not None, relu), x.shape[0])


def run(chunks: Sequence[Any], x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, relu: bool = False,
        validate: bool = True) -> Tensor:
    return chunks[0].kernel(x, weight) if bias is None else chunks[0].kernel(x, weight, bias)


def compiled(w: Workload) -> tuple[Any, ...]:
    return (w.k, w.n, w.bias, w.relu)


def describe(signature: tuple[Any, ...]) -> str:
    k, n, bias, relu = signature
    return f"k={k} n={n} bias={bias} relu={relu}"


Case = tuple[str, tuple[Any, ...], dict[str, Any]]


def cases(w: Workload, seed: int, count: int) -> Iterable[Case]:
    """The tuned M, one row, one past the tuned rows and not a whole task, zero activations, activations of
    both signs, magnitudes from 1e-20 to 1e20 (pieces of tiny and huge floats), a row whose products cancel,
    and `count` random M."""

    def tensors(m: int, s: int) -> list[Tensor]:
        return list(inputs(dataclasses.replace(w, m=m), s))

    def call(name: str, ts: list[Tensor]) -> Case:
        return name, (ts[0], ts[1], ts[2] if w.bias else None, w.relu), {}

    out = [call(f"m={m}" + (" (tuned)" if m == w.m else ""), tensors(m, seed + i))
           for i, m in enumerate(dict.fromkeys([w.m, 1, w.m + 1, 2 * w.m + 3]))]
    ts = tensors(w.m, seed)
    out.append(call("zero activations", [torch.zeros_like(ts[0]), *ts[1:]]))
    gen = torch.Generator().manual_seed(seed)
    out.append(call("activations of both signs", [torch.randn(ts[0].shape, generator=gen), *ts[1:]]))
    scale = torch.pow(10.0, torch.empty(w.m, 1).uniform_(-20, 20, generator=gen))
    out.append(call("row magnitudes 1e-20 to 1e20", [(ts[0] * scale).contiguous(), *ts[1:]]))
    cancel, weight = ts[0].clone(), ts[1].clone()
    cancel[:, 1::2] = cancel[:, 0:w.k - 1:2]  # pairs of equal activations
    weight[:, 1::2] = -weight[:, 0:w.k - 1:2]  # times opposite weights: each row's products cancel
    out.append(call("products that cancel", [cancel.contiguous(), weight.contiguous(), *ts[2:]]))
    rng = random.Random(seed)
    for i in range(count):
        m = rng.randint(1, 3 * w.m + 8)
        out.append(call(f"random m={m} (seed {seed + 10 + i})", tensors(m, seed + 10 + i)))
    return out


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, weight, bias, relu, _ = inputs
    save_linear(ctx, x, weight, bias, relu, output)


def _backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    return (*linear_grads(ctx, grad), None, None)


BINDING = TorchBinding(
    op=split_linear, fake=fake, check=check, route=route, run=run, compiled=compiled, size=lambda w: w.m,
    any_size=True, describe=describe, cases=cases, replayable=True,  # `check` reads metadata only
    backward=_backward, setup_context=_setup_context)
