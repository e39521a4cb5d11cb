"""Linear's backward for the torch ops that compute a Linear (+ ReLU): split_linear's and tune_model's oneDNN
`dense_linear` (autotune/torch/dense.py). Inputs of any leading dimensions, as nn.Linear's."""

from __future__ import annotations

from typing import Any

__all__ = ["linear_grads", "save_linear"]


def save_linear(ctx: Any, x: Any, weight: Any, bias: Any, relu: bool, output: Any) -> None:
    """What the backward needs: x, the weight, the output where a ReLU was fused (its mask), whether a bias."""
    ctx.save_for_backward(x, weight, output if relu else None)
    ctx.has_bias = bias is not None


def linear_grads(ctx: Any, grad: Any) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias), each None where not needed, through the ReLU's mask (y > 0) where it was fused."""
    x, weight, y = ctx.saved_tensors
    if y is not None:
        grad = grad * (y > 0)
    g2 = grad.reshape(-1, grad.shape[-1])
    dx = grad @ weight if ctx.needs_input_grad[0] else None
    dw = g2.T @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
    db = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return dx, dw, db
