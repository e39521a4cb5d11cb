"""How DCNv2's cross tail appears in a captured graph after a Linear: `x0 * (y + b) + x`.

TorchRec's LowRankCrossNet (MLPerf's DLRMv2) writes `x_l = x_0 * (x_l_w + self.bias[layer]) + x_l` after a
bias-free `linear`: `add(y, b)` with b a float32 (N,) parameter, `mul(x0, .)` and `add(., x)` with x0 and x
(M, N) float32 tensors, each step the previous one's only user, in either operand order. A Linear with its own
bias followed by `x0 * y + x` is the same tail without the add. The rules that run a Linear ask `cross_tail`
about it and, where one follows, run the tail in their kernel's epilogue: qmatmul's chain rule (int8, ending the
chain with qmatmul_cross) and split_linear's (float32, split_linear_cross).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ._graph import attr, register, sole_user, tensor_value

__all__ = ["CrossTail", "cross_tail", "tail_bias"]

aten = torch.ops.aten


@dataclass(frozen=True)
class CrossTail:
    """The tail's nodes (the bias add, if any; the product; the residual add, `out`) and its bias parameter's
    node (or None). x0 and x are read off the nodes when asked: a match replaced before this one's may have
    rewired them (a cross layer's x is the previous layer's output)."""

    nodes: tuple[Any, ...]
    bias: Any
    head: Any  # what the product with x0 multiplies: the bias add, or the Linear's output

    @property
    def out(self) -> Any:
        return self.nodes[-1]

    @property
    def x0(self) -> Any:
        return _other(self.nodes[-2], self.head)

    @property
    def x(self) -> Any:
        return _other(self.out, self.nodes[-2])


def _other(node: Any, operand: Any) -> Any:
    """The operand of binary `node` beside `operand` (None when it is not a plain two-tensor call)."""
    if len(node.args) != 2 or node.kwargs or operand not in node.args or node.args[0] is node.args[1]:
        return None
    return node.args[1] if node.args[0] is operand else node.args[0]


def _rows(gm: Any, values: dict[str, Any], node: Any, shape: tuple[int, int]) -> bool:
    """Whether `node` is a float32 (M, N) contiguous tensor computed in the graph (the kernel reads it in place)."""
    v = tensor_value(gm, values, node)
    return (isinstance(v, torch.Tensor) and v.dtype == torch.float32 and tuple(v.shape) == shape
            and v.is_contiguous())


def cross_tail(gm: Any, values: dict[str, Any], y: Any, shape: tuple[int, int]) -> CrossTail | None:
    """The cross tail that follows node `y` (an (M, N) = `shape` float32 Linear output), or None."""
    nodes: list[Any] = []
    head, bias = y, None
    add = sole_user(y, aten.add.Tensor)
    if add is not None:
        b = _other(add, y)
        value = attr(gm, b.target) if getattr(b, "op", None) == "get_attr" else None
        if not (isinstance(value, torch.Tensor) and value.dtype == torch.float32 and tuple(value.shape) == shape[1:]):
            return None
        nodes, head, bias = [add], add, b
    mul = sole_user(head, aten.mul.Tensor)
    x0 = _other(mul, head) if mul is not None else None
    if x0 is None or not _rows(gm, values, x0, shape):
        return None
    residual = sole_user(mul, aten.add.Tensor)
    x = _other(residual, mul) if residual is not None else None
    if x is None or not _rows(gm, values, x, shape):
        return None
    return CrossTail((*nodes, mul, residual), bias, head)


def tail_bias(gm: Any, linear_bias: Any, tail: CrossTail) -> Any:
    """The bias node of a kernel that runs the Linear and its tail: the Linear's, the tail's, or their sum
    registered once."""
    if linear_bias is None or tail.bias is None:
        return linear_bias if tail.bias is None else tail.bias
    total = attr(gm, linear_bias.target).detach() + attr(gm, tail.bias.target).detach()
    return register(gm, "autotune_cross_bias", total.contiguous())
