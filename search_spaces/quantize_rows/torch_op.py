"""`torch.ops.autotune.quantize_rows`: row-wise int8 quantization of activations as a PyTorch op.

Kernels are compiled for the row width (cols) and the range (qmax) and take any number of rows. The op returns
(q, scale) and has no gradient: it serves int8 inference (qmatmul's QuantLinear calls it in front of every int8
layer, with qmax=63 where its kernels need 7-bit activations).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Iterable, Optional, Sequence

import torch
from torch import Tensor

from ..template import Route, TorchBinding
from .checks import check
from .workload import QMAX, Workload, inputs, quantize_rows as _quantize_rows

__all__ = ["BINDING", "quantize_rows"]


def quantize_rows(x: Tensor, qmax: int = QMAX, smooth: Optional[Tensor] = None, validate: bool = True
                  ) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per row of a (rows, cols) float32 x: (q = round(x / scale) in [-qmax, qmax] (half to
    even), scale = max(max |x_row|, 1e-12) / qmax, float32 (rows,)). qmax=63: 7-bit activations. `smooth`
    (cols,): x * smooth is quantized instead, in the same pass (a smoothed int8 layer's input, SmoothQuant).
    bfloat16 x (CPUs): the result of `x.float()`'s, without that copy."""
    return _quantize_rows(x, qmax, smooth)


def fake(x: Tensor, qmax: int = QMAX, smooth: Optional[Tensor] = None, validate: bool = True
         ) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape, dtype=torch.int8), x.new_empty(x.shape[0], dtype=torch.float32)


def route(x: Tensor, qmax: int = QMAX, smooth: Optional[Tensor] = None, validate: bool = True) -> Route | str:
    if x.dim() != 2:  # validate=False skips check: route must not index a shape that is not there
        return f"x must be 2-D, got shape {tuple(x.shape)}"
    if x.dtype not in _DTYPES or not x.is_contiguous():
        return f"kernels take contiguous float32 or bfloat16, got {x.dtype}" + (
            "" if x.is_contiguous() else " (strided)")
    if (smooth is not None or x.dtype is not torch.float32) and x.device.type != "cpu":
        return "smoothing factors and bfloat16 rows are quantized on CPUs only"
    return Route((x.shape[1], qmax, smooth is not None, _DTYPES[x.dtype]), x.shape[0])


_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def run(chunks: Sequence[Any], x: Tensor, qmax: int = QMAX, smooth: Optional[Tensor] = None,
        validate: bool = True) -> tuple[Tensor, Tensor]:
    # the kernel was compiled for this qmax and for smoothing or not: route matched them
    return chunks[0].kernel(x) if smooth is None else chunks[0].kernel(x, smooth)


def compiled(w: Workload) -> tuple[Any, ...]:
    return (w.cols, w.qmax, w.smooth, w.dtype)


def describe(signature: tuple[Any, ...]) -> str:
    cols, qmax, smooth, dtype = signature
    return f"cols={cols} qmax={qmax}" + (" smooth" if smooth else "") + ("" if dtype == "float32" else f" {dtype}")


def cases(w: Workload, seed: int, count: int) -> Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """The tuned rows, one row and one past the tuned rows, a zero row (the 1e-12 clamp), huge and tiny
    magnitudes, quotients exactly on .5 (half to even) and at the ends of the range, and `count` random rows;
    each x of the workload's dtype."""

    def x_of(rows: int, s: int) -> Tensor:
        return inputs(dataclasses.replace(w, rows=rows), s)[0]

    factors = inputs(w, seed)[1] if w.smooth else None  # one set of factors: a model's are fixed

    def call(name: str, x: Tensor) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        return name, (x.to(getattr(torch, w.dtype)),), {"qmax": w.qmax, **({"smooth": factors} if w.smooth else {})}

    rng = random.Random(seed)
    out = [call(f"rows={r}" + (" (tuned)" if r == w.rows else ""), x_of(r, seed + i))
           for i, r in enumerate(dict.fromkeys([w.rows, 1, w.rows + 1]))]
    zeros = x_of(w.rows, seed)
    zeros[0] = 0.0
    out.append(call("a zero row", zeros))
    out.append(call("magnitudes 1e30 and 1e-30", _magnitudes(x_of(w.rows, seed + 3))))
    out.append(call("quotients on .5 boundaries", half_boundaries(w.rows, w.cols, seed, qmax=w.qmax)))
    out.append(call("quotients on .5 boundaries, random scales",
                    half_boundaries(w.rows, w.cols, seed, True, w.qmax)))
    for i in range(count):
        rows = rng.randint(1, 2 * w.rows + 8)
        out.append(call(f"random rows={rows} (seed {seed + 10 + i})", x_of(rows, seed + 10 + i)))
    return out


def _magnitudes(x: Tensor) -> Tensor:
    """Rows alternately scaled to ~1e30 and ~1e-30 (the clamp makes the tiny rows' q all zero)."""
    x = x / x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    factor = torch.where(torch.arange(x.shape[0]) % 2 == 0, 1e30, 1e-30)
    return (x * factor[:, None]).contiguous()


def half_boundaries(rows: int, cols: int, seed: int, random_scales: bool = False, qmax: int = QMAX) -> Tensor:
    """Rows whose quotients x / scale lie on k + 0.5 in (-qmax, qmax) (for scale 1: exactly; otherwise as close
    as float32 allows, where dividing and multiplying by the reciprocal round differently), with the row max
    (qmax * s) at column 0.

    With `random_scales` s is random, so scale = s up to rounding; otherwise s = 1."""
    gen = torch.Generator().manual_seed(seed)
    s = (torch.pow(10.0, torch.empty(rows, 1).uniform_(-4, 4, generator=gen)) if random_scales
         else torch.ones(rows, 1))
    k = torch.randint(-qmax, qmax, (rows, cols), generator=gen).float() + 0.5
    x = k * s
    x[:, 0] = (qmax * s)[:, 0]
    return x.contiguous()


BINDING = TorchBinding(
    op=quantize_rows, fake=fake, check=check, route=route, run=run, compiled=compiled, size=lambda w: w.rows,
    any_size=True, describe=describe, cases=cases,
    replayable=True)  # `check` reads metadata only (any float values quantize)
