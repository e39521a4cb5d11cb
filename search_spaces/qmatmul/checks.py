"""What the quantized matmul accepts, as clear errors: the torch op's checks (dtypes, shapes like nn.Linear's,
scales, one device; metadata only, but for the range of promised 7-bit activations), shared with ops that take
its operands (qmatmul_requant), and the template's `check_inputs`, which adds the M, K and N of one compiled
kernel.

Imports torch, so workload.py never imports this module: it sits between the workload and the torch op
(torch_op.py), and the package's `check_inputs` imports it on first use.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from .._torch_checks import fits, need, same_device_contiguous
from ..template import InvalidDtype
from .workload import A_BITS, Workload, a_range, quantized

__all__ = ["check", "check_inputs", "check_operands", "op_arguments"]

OP = "qmatmul"


def check(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor, bias: Optional[Tensor] = None,
          relu: bool = False, a_bits: int = 8, validate: bool = True) -> None:
    """What the op's semantics reject, as clear errors (dtypes, shapes like nn.Linear's, scales, one device).
    Metadata only, in one expression; `_explain` says what is wrong when it fails. The one pass over data:
    with `a_bits=7`, the activations' range (a kernel relying on it would saturate silently otherwise)."""
    check_operands(OP, a, weight, a_scale, w_scale, bias, a_bits)


def check_operands(op: str, a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor,
                   bias: Optional[Tensor], a_bits: int) -> None:
    """`check` for op `op` (qmatmul, or an op that takes qmatmul's operands: errors name the op called)."""
    sa, sw = a.shape, weight.shape
    if (len(sa) == 2 and len(sw) == 2 and sw[1] == sa[1] and weight.dtype is _I8
            and (_vector(a_scale, sa[0]) if a.dtype is _I8 or a.dtype is _U8 else a.dtype is _F32 and a_scale is None)
            and _vector(w_scale, sw[0]) and (bias is None or _vector(bias, sw[0]))
            and fits(a, weight, a_scale, w_scale, bias)):
        if a_bits != 8:  # the 7-bit calls int8 models make: their range, checked on the fast path too
            _check_a_bits(op, a, a_bits)
        return
    _explain(op, a, weight, a_scale, w_scale, bias)
    _check_a_bits(op, a, a_bits)


_I8, _U8, _F32 = torch.int8, torch.uint8, torch.float32


def _vector(t: Optional[Tensor], size: int) -> bool:
    """A float32 vector of `size` elements (one scale or bias per row or channel)."""
    return t is not None and t.dtype is _F32 and t.dim() == 1 and t.shape[0] == size


def _explain(op: str, a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor,
             bias: Optional[Tensor]) -> None:
    need(a.dim() == 2, op, f"a must be 2-D (m, k), got shape {tuple(a.shape)}")
    need(a.dtype in (torch.int8, torch.uint8, torch.float32), op,
         f"a must be int8 or uint8 (with a_scale) or float32 (weight-only), got {a.dtype}", InvalidDtype)
    need(weight.dtype == torch.int8, op, f"weight must be int8, got {weight.dtype}", InvalidDtype)
    need(weight.dim() == 2 and weight.shape[1] == a.shape[1], op,
         f"weight must be (n, {a.shape[1]}) like nn.Linear's for a of shape {tuple(a.shape)}, "
         f"got {tuple(weight.shape)}")
    m, n = a.shape[0], weight.shape[0]
    if a.dtype in (torch.int8, torch.uint8):
        need(a_scale is not None, op, f"{a.dtype} activations need a_scale (one float32 scale per row)")
    else:
        need(a_scale is None, op, "float32 activations (weight-only) take no a_scale")
    for name, t, size in (("a_scale", a_scale, m), ("w_scale", w_scale, n), ("bias", bias, n)):
        if t is not None:
            need(t.dtype == torch.float32, op, f"{name} must be float32, got {t.dtype}", InvalidDtype)
            need(tuple(t.shape) == (size,), op, f"{name} must be ({size},), got {tuple(t.shape)}")
    same_device_contiguous(op, a=a, weight=weight, a_scale=a_scale, w_scale=w_scale, bias=bias)


def _check_a_bits(op: str, a: Tensor, a_bits: int) -> None:
    """a_bits is 8 or 7, and 7-bit activations lie in their range (one aminmax pass)."""
    need(a_bits in A_BITS and not isinstance(a_bits, bool), op, f"a_bits must be 7 or 8, got {a_bits!r}"
         + (" (the argument after relu is a_bits now: pass validate= by keyword)" if a_bits in (0, 1) else ""))
    if a_bits != 8:
        need(a.dtype == torch.int8, op, "a_bits applies to int8 activations only")
        lo, hi = a_range(a_bits)
        if a.numel():
            amin, amax = (int(v) for v in torch.aminmax(a))
            need(lo <= amin and amax <= hi, op,
                 f"a_bits={a_bits} activations must lie in [{lo}, {hi}], got values in [{amin}, {amax}] "
                 f"(quantize them with quantize_rows(x, {hi}))")


def op_arguments(w: Workload, tensors: Sequence[Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The op's arguments for the template's reference-order tensors of `w`."""
    if quantized(w):
        a, weight, a_scale, w_scale, *rest = tensors
    else:
        (a, weight, w_scale, *rest), a_scale = tensors, None
    return (a, weight, a_scale, w_scale, rest[0] if w.bias else None), {"relu": w.relu, "a_bits": w.a_bits}


def _need(cond: bool, msg: str, exc: type[Exception] = ValueError) -> None:
    """check_inputs' `need`: its messages name the template (those of `check` the torch op)."""
    if not cond:
        raise exc(f"qmatmul: {msg}")


def check_inputs(w: Workload, *tensors: Any) -> None:
    """Raise a clear error for tensors this workload's kernel cannot take: first what it needs (the tensors of
    its mode and options, its M, K and N), then the op's own semantics (`check`: dtypes, scales, one device,
    contiguity)."""
    names = (["a", "weight", "a_scale", "w_scale"] if quantized(w) else ["a", "weight", "w_scale"])
    names += ["bias"] if w.bias else []
    _need(len(tensors) == len(names), f"expected ({', '.join(names)}), got {len(tensors)} tensors", TypeError)
    t = dict(zip(names, tensors))
    for name, x in t.items():
        _need(isinstance(x, torch.Tensor), f"{name} must be a torch.Tensor", TypeError)
    a_dtype = {"int8": torch.int8, "uint8": torch.uint8}.get(w.mode, torch.float32)
    _need(t["a"].dtype == a_dtype, f"a must be {a_dtype}, got {t['a'].dtype}", TypeError)
    _need(tuple(t["a"].shape) == (w.m, w.k), f"a must be ({w.m}, {w.k}), got {tuple(t['a'].shape)}")
    _need(tuple(t["weight"].shape) == (w.n, w.k), f"weight must be ({w.n}, {w.k}), got {tuple(t['weight'].shape)}")
    args, kwargs = op_arguments(w, tensors)
    check(*args, **kwargs)
