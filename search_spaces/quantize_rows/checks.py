"""What quantize_rows accepts, as clear errors: the torch op's checks (a 2-D float32 contiguous tensor, bfloat16
on CPUs too, a range
int8 holds; metadata only), and the template's `check_inputs`, which adds the row width of one compiled kernel.

Imports torch, so workload.py never imports this module: it sits between the workload and the torch op
(torch_op.py), and the package's `check_inputs` imports it on first use.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from .._torch_checks import need
from ..template import InvalidDtype, InvalidInput
from .workload import QMAX, QMIN, Workload

__all__ = ["check", "check_inputs"]

OP = "quantize_rows"


def check(x: Tensor, qmax: int = QMAX, smooth: Optional[Tensor] = None, validate: bool = True) -> None:
    """Metadata only (no pass over the data): a 2-D float32 contiguous tensor (or bfloat16 on a CPU), a range
    int8 holds and, where given, one float32 smoothing factor per column on x's device. One expression on the
    fast path; `_explain` says what is wrong when it fails."""
    if x.dim() == 2 and (x.dtype is _F32 or (x.dtype is _BF16 and x.device.type == "cpu")) and x.is_contiguous() \
            and QMIN <= qmax <= QMAX and (
            smooth is None or (smooth.shape == x.shape[1:] and smooth.dtype == torch.float32
                               and smooth.device == x.device and smooth.is_contiguous())):
        return
    _explain(x, qmax, smooth)


_F32, _BF16 = torch.float32, torch.bfloat16


def _explain(x: Tensor, qmax: int, smooth: Optional[Tensor] = None) -> None:
    need(x.dim() == 2, OP, f"x must be 2-D (rows, cols), got shape {tuple(x.shape)}")
    need(x.dtype in (_F32, _BF16), OP, f"x must be float32 (or bfloat16 on a CPU), got {x.dtype}", InvalidDtype)
    need(x.dtype == _F32 or x.device.type == "cpu", OP, f"bfloat16 rows are quantized on CPUs only, x is on "
         f"{x.device}", InvalidDtype)
    need(x.is_contiguous(), OP, "x must be contiguous (call .contiguous() on it)")
    need(QMIN <= qmax <= QMAX, OP, f"qmax must be in [{QMIN}, {QMAX}] (q is int8, symmetric), got {qmax}"
         + (" (the second argument is qmax now: pass validate= by keyword)" if qmax in (0, 1) else ""))
    if smooth is not None:
        need(isinstance(smooth, Tensor) and smooth.shape == x.shape[1:], OP,
             lambda: f"smooth must hold one factor per column, shape ({x.shape[1]},), got "
                     f"{tuple(getattr(smooth, 'shape', ()))}")
        need(smooth.dtype == torch.float32, OP, f"smooth must be float32, got {smooth.dtype}", InvalidDtype)
        need(smooth.device == x.device, OP, f"smooth is on {smooth.device} but x on {x.device}: one device")
        need(smooth.is_contiguous(), OP, "smooth must be contiguous (call .contiguous() on it)")


def check_inputs(w: Workload, x: Any, smooth: Any = None) -> None:
    """What this workload's kernel needs (a (rows, cols) tensor of its dtype, any rows; the factors where it
    smooths), then the op's own checks."""
    if not isinstance(x, torch.Tensor):
        raise InvalidDtype(f"quantize_rows: x must be a torch.Tensor, got {type(x).__name__}")
    if (smooth is not None) != w.smooth:
        raise InvalidInput(f"quantize_rows: this kernel {'takes' if w.smooth else 'takes no'} smoothing factors")
    check(x, w.qmax, smooth=smooth)
    if x.dtype != getattr(torch, w.dtype):
        raise InvalidDtype(f"quantize_rows: this kernel reads {w.dtype} rows, got {x.dtype}")
    if x.shape[1] != w.cols:
        raise InvalidInput(f"quantize_rows: x must have {w.cols} columns for this kernel, got {tuple(x.shape)}")
