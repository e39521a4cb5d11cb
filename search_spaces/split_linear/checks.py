"""What split_linear accepts, as clear errors: the torch op's checks (metadata only) and the template's
`check_inputs`, which adds the shape of one compiled kernel. Imports torch (workload.py never imports this)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from .._torch_checks import need
from ..template import InvalidDtype, InvalidInput
from .workload import Workload

__all__ = ["check", "check_inputs", "check_operands"]

OP = "split_linear"


def check(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, relu: bool = False,
          validate: bool = True) -> None:
    """x (M, K), weight (N, K) and bias (N,), float32, contiguous, on one device (`check_operands`)."""
    check_operands(OP, x, weight, bias)


def check_operands(op: str, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> None:
    """A float32 Linear's operands as split_linear's kernels take them, errors naming `op` (split_linear_cross
    checks its own this way). One expression on the fast path; `_explain` says what is wrong when it fails."""
    if (x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1]
            and x.dtype == weight.dtype == torch.float32 and x.is_contiguous() and weight.is_contiguous()
            and x.device == weight.device
            and (bias is None or (bias.shape == weight.shape[:1] and bias.dtype == torch.float32
                                  and bias.device == x.device and bias.is_contiguous()))):
        return
    _explain(op, x, weight, bias)


def _explain(op: str, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> None:
    need(x.dim() == 2, op, f"x must be 2-D (rows, in_features), got shape {tuple(x.shape)}")
    need(weight.dim() == 2, op, f"weight must be 2-D (out_features, in_features), got {tuple(weight.shape)}")
    need(x.shape[1] == weight.shape[1], op,
         f"x has {x.shape[1]} features but weight takes {weight.shape[1]} (weight is (out, in))")
    need(x.dtype == torch.float32, op, f"x must be float32, got {x.dtype}", InvalidDtype)
    need(weight.dtype == torch.float32, op, f"weight must be float32, got {weight.dtype}", InvalidDtype)
    need(x.device == weight.device, op, f"x is on {x.device} but weight on {weight.device}: one device")
    need(x.is_contiguous(), op, "x must be contiguous (call .contiguous() on it)")
    need(weight.is_contiguous(), op, "weight must be contiguous (call .contiguous() on it)")
    if bias is not None:
        need(bias.shape == weight.shape[:1], op,
             f"bias must hold one value per output, shape ({weight.shape[0]},), got {tuple(bias.shape)}")
        need(bias.dtype == torch.float32, op, f"bias must be float32, got {bias.dtype}", InvalidDtype)
        need(bias.device == x.device, op, f"bias is on {bias.device} but x on {x.device}: one device")
        need(bias.is_contiguous(), op, "bias must be contiguous (call .contiguous() on it)")


def check_inputs(w: Workload, x: Any, weight: Any, bias: Any = None, op: str = OP) -> None:
    """What this workload's kernel needs ((M, k) x, an (n, k) weight, a bias where it has one), then the op's
    own checks; errors name `op`."""
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise InvalidDtype(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if (bias is not None) != w.bias:
        raise InvalidInput(f"{op}: this kernel {'takes' if w.bias else 'takes no'} bias")
    check_operands(op, x, weight, bias)
    if tuple(weight.shape) != (w.n, w.k):
        raise InvalidInput(f"{op}: weight must be ({w.n}, {w.k}) for this kernel, got {tuple(weight.shape)}")
