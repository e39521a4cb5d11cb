"""`torch.ops.autotune.interaction` and `DotInteraction`: how the dot interaction appears in PyTorch.

The op takes the embeddings stacked, `ly (batch, tables, dim)`; its kernels are compiled for (tables, dim,
self_interaction) and take any batch. Gradients: Z = T T^T, so dL/dT = (G + G^T) T (see `_backward`).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor, nn

from ..template import ModuleRule, Route, TorchBinding
from .checks import check
from .workload import Workload, dot_interaction, inputs

__all__ = ["BINDING", "DotInteraction", "interaction", "quarter_turn"]


def interaction(x: Tensor, ly: Tensor, self_interaction: bool = False, validate: bool = True) -> Tensor:
    """DLRM's dot interaction: cat([x, tril(T T^T)]) with T = [x, ly[:, 0], ..., ly[:, tables-1]] per sample."""
    return dot_interaction(x, ly, self_interaction)


def _pairs(features: Any, self_interaction: bool) -> Any:
    return features * (features + 1) // 2 if self_interaction else features * (features - 1) // 2


def fake(x: Tensor, ly: Tensor, self_interaction: bool = False, validate: bool = True) -> Tensor:
    return x.new_empty(x.shape[0], x.shape[1] + _pairs(ly.shape[1] + 1, self_interaction))


def route(x: Tensor, ly: Tensor, self_interaction: bool = False, validate: bool = True) -> Route | str:
    batch, tables, dim = ly.shape
    signature = (tables, dim, self_interaction, "dot")
    if batch < 1:
        return Route(signature, 0)
    if x.dtype != torch.float32:
        return f"kernels take float32, got {x.dtype}"
    if x.is_cuda and batch * max(tables * dim, dim + _pairs(tables + 1, self_interaction)) >= 2**31:
        return f"batch {batch} overflows the GPU kernels' 32-bit indexing"
    return Route(signature, batch)


def run(chunks: Sequence[Any], x: Tensor, ly: Tensor, self_interaction: bool = False,
        validate: bool = True) -> Tensor:
    return chunks[0].kernel(x, ly)


def compiled(w: Workload) -> tuple[Any, ...]:
    return (w.tables, w.dim, w.self_interaction, w.mode)


def describe(signature: tuple[Any, ...]) -> str:
    tables, dim, self_interaction, _ = signature
    return f"tables={tables} dim={dim} self_interaction={self_interaction}"


def cases(w: Workload, seed: int, count: int) -> Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """The tuned batch, batch 1 and one past it, zeros, large values, large terms whose dot products cancel, and
    `count` random batches."""
    if w.mode != "dot":  # the op computes the dot interaction only: a cat kernel serves no call of it
        return []

    def call(name: str, batch: int, s: int, scale: float = 1.0,
             cancel: bool = False) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        x, ly = inputs(dataclasses.replace(w, batch=batch), s)
        if cancel:
            ly = quarter_turn(x).unsqueeze(1) + 1e-3 * ly
        return name, (x * scale, ly * scale), {"self_interaction": w.self_interaction}

    rng = random.Random(seed)
    out = [call(f"tuned batch {w.batch}", w.batch, seed), call("batch 1", 1, seed + 1),
           call(f"batch {w.batch + 1}", w.batch + 1, seed + 2), call("zeros", w.batch, seed, 0.0),
           call("values of magnitude 1e3", w.batch, seed + 3, 1e3),
           call("cancelling dot products of magnitude 1e3", w.batch, seed + 4, 1e3, cancel=True)]
    for i in range(count):
        batch = rng.randint(1, 2 * w.batch + 8)
        out.append(call(f"random batch {batch} (seed {seed + 10 + i})", batch, seed + 10 + i))
    return out


def quarter_turn(v: Tensor) -> Tensor:
    """`v` turned a quarter in each plane of its coordinates (2i, 2i+1), an odd last one zeroed: orthogonal to v,
    so v . (quarter_turn(v) + a small e) = v . e is small beside the sum of its terms' sizes. Dot products that
    cancel so: their rounding error is large beside the result and small beside the terms."""
    out = torch.zeros_like(v)
    n = v.shape[-1] // 2 * 2
    out[..., 0:n:2] = v[..., 1:n:2]
    out[..., 1:n:2] = -v[..., 0:n:2]
    return out


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    # (`inputs` shadows nothing it needs: it is the keyword torch passes the op's arguments by)
    x, ly, self_interaction, _ = inputs
    ctx.save_for_backward(x, ly)
    ctx.self_interaction = self_interaction


def _backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    """Z = T T^T, so dL/dT = (G + G^T) T where G holds the kept pairs' gradients (zero elsewhere)."""
    x, ly = ctx.saved_tensors
    t = torch.cat([x.unsqueeze(1), ly], dim=1)
    b, f, d = t.shape
    li, lj = torch.tril_indices(f, f, offset=0 if ctx.self_interaction else -1, device=x.device)
    g = grad.new_zeros(b, f * f).index_copy(1, li * f + lj, grad[:, d:].contiguous()).view(b, f, f)
    gt = torch.bmm(g + g.transpose(1, 2), t)
    return grad[:, :d] + gt[:, 0], gt[:, 1:], None, None


class DotInteraction(nn.Module):
    """DLRM's dot interaction: `cat([x, tril(T T^T)])` with T the dense vector and the T embeddings of a sample.

    `ly` is the list of (batch, dim) embeddings DLRM passes (stacked here: one copy) or one (batch, tables, dim)
    tensor. `self_interaction` keeps the diagonal (DLRM's `arch_interaction_itself`).
    """

    def __init__(self, self_interaction: bool = False, validate: bool = True):
        super().__init__()
        self.self_interaction = self_interaction
        self.validate = validate

    @classmethod
    def from_module(cls, module: nn.Module, validate: bool = True) -> "DotInteraction":
        """For a model's own interaction module with the same semantics (its `self_interaction`, if it has one)."""
        return cls(bool(getattr(module, "self_interaction", False)), validate=validate)

    def forward(self, x: Tensor, ly: Tensor | Sequence[Tensor]) -> Tensor:
        stacked = ly if isinstance(ly, Tensor) else torch.stack(list(ly), dim=1)
        return torch.ops.autotune.interaction(x.contiguous(), stacked.contiguous(), self.self_interaction,
                                              self.validate)

    def extra_repr(self) -> str:
        return f"self_interaction={self.self_interaction}"


def _keep_with_kernel(module: nn.Module, next_module: Any, has_kernel: Any, validate: bool) -> Any:
    """A DotInteraction (made by optimize's `extra=` from a model's own module) runs only with a kernel for its
    self_interaction; there is no standard PyTorch module to swap for it."""
    if not isinstance(module, DotInteraction):
        return None
    si = module.self_interaction
    if not has_kernel(lambda w: w.mode == "dot" and w.self_interaction == si):
        return f"no interaction kernel with self_interaction={si}"
    module.validate = validate
    return module, False


BINDING = TorchBinding(
    op=interaction, fake=fake, check=check, route=route, run=run, compiled=compiled, size=lambda w: w.batch,
    any_size=True, describe=describe, cases=cases, backward=_backward, setup_context=_setup_context,
    replayable=True,  # `check` and `route` read metadata only (any float values are valid input)
    rules=(ModuleRule("DotInteraction (from extra=) kept only with a kernel", _keep_with_kernel),),
    exports=(("DotInteraction", DotInteraction),))
