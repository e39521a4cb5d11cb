"""What the interaction accepts, as clear errors: the torch op's checks (shapes, one floating dtype, one device;
metadata only), and the template's `check_inputs`, which adds what one compiled kernel needs (float32, its
tables and dim, the embeddings listed or stacked).

Imports torch, so workload.py never imports this module: it sits between the workload and the torch op
(torch_op.py), and the package's `check_inputs` imports it on first use.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._torch_checks import fits, need, same_device_contiguous
from ..template import InvalidDtype, InvalidInput
from .workload import Workload

__all__ = ["check", "check_inputs"]

OP = "interaction"


def check(x: Tensor, ly: Tensor, self_interaction: bool = False, validate: bool = True) -> None:
    """What the op's PyTorch semantics reject, as clear errors (shapes, one floating dtype, one device).
    Metadata only, in one expression; `_explain` says what is wrong when it fails."""
    xs, ls = x.shape, ly.shape
    if (len(xs) == 2 and len(ls) == 3 and ls[0] == xs[0] and ls[2] == xs[1] and x.dtype is ly.dtype
            and x.is_floating_point() and fits(x, ly)):
        return
    _explain(x, ly)


def _explain(x: Tensor, ly: Tensor) -> None:
    need(x.dim() == 2, OP, f"x must be 2-D (batch, dim), got shape {tuple(x.shape)}")
    need(ly.dim() == 3, OP, f"ly must be 3-D (batch, tables, dim): the embeddings stacked, got {tuple(ly.shape)}")
    need(x.is_floating_point() and ly.dtype == x.dtype, OP,
         f"x and ly must be floating point of one dtype, got {x.dtype} and {ly.dtype}", InvalidDtype)
    need(ly.shape[0] == x.shape[0] and ly.shape[2] == x.shape[1], OP,
         f"ly must be ({x.shape[0]}, tables, {x.shape[1]}) for x of shape {tuple(x.shape)}, got {tuple(ly.shape)}"
         + (f": ly has batch {ly.shape[0]} but x has {x.shape[0]}" if ly.shape[0] != x.shape[0] else ""))
    same_device_contiguous(OP, x=x, ly=ly)


def _need(cond: bool, msg: str, exc: type[Exception] = InvalidInput) -> None:
    """check_inputs' `need`: its messages name the template (those of `check` the torch op)."""
    if not cond:
        raise exc(f"interaction: {msg}")


def check_inputs(w: Workload, x: Any, ly: Any) -> None:
    """Raise a clear error for tensors the kernel cannot take (any batch size works; any one device)."""

    def same_device(name: str, t: Any) -> None:
        _need(t.device == x.device,
              f"{name} is on {t.device} but x is on {x.device}: all inputs must be on one device")

    _need(isinstance(x, torch.Tensor), f"x must be a torch.Tensor, got {type(x).__name__}", TypeError)
    _need(x.dtype == torch.float32, f"x must be float32, got {x.dtype}", InvalidDtype)
    _need(x.dim() == 2 and x.shape[1] == w.dim, f"x must be (batch, {w.dim}), got {tuple(x.shape)}")
    _need(x.is_contiguous(), "x must be contiguous")
    batch = x.shape[0]
    if x.device.type == "cuda":  # the CUDA kernels index with 32-bit integers
        _need(batch * max(w.tables * w.dim, w.out_dim) < 2**31,
              f"batch {batch} is too large for one CUDA call at this shape (32-bit indexing): split the batch")
    if isinstance(ly, torch.Tensor):  # what this kernel needs, then the op's own semantics (`check`)
        _need(ly.dtype == torch.float32, f"ly must be float32, got {ly.dtype}", InvalidDtype)
        same_device("ly", ly)
        _need(ly.dim() == 3 and tuple(ly.shape[1:]) == (w.tables, w.dim),
              f"stacked ly must be (batch, {w.tables}, {w.dim}), got {tuple(ly.shape)}")
        check(x, ly)
        return
    _need(isinstance(ly, (list, tuple)),
          f"ly must be a list of {w.tables} (batch, {w.dim}) tensors or a (batch, {w.tables}, {w.dim}) tensor, "
          f"got {type(ly).__name__}", TypeError)
    _need(len(ly) == w.tables, f"ly must hold {w.tables} tensors (one per table), got {len(ly)}")
    for k, e in enumerate(ly):
        _need(isinstance(e, torch.Tensor), f"ly[{k}] must be a torch.Tensor, got {type(e).__name__}", TypeError)
        _need(e.dtype == torch.float32, f"ly[{k}] must be float32, got {e.dtype}", InvalidDtype)
        same_device(f"ly[{k}]", e)
        _need(tuple(e.shape) == (batch, w.dim), f"ly[{k}] must be ({batch}, {w.dim}), got {tuple(e.shape)}")
