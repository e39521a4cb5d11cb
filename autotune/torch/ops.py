"""`torch.ops.autotune.{embedding_bag,interaction,qmatmul}`: tuned kernels as PyTorch custom operators.

Each operator is a `torch.library.custom_op` with a fake (meta) implementation, so it works in eager mode and
as one opaque node under `torch.compile(fullgraph=True)`. A call runs the loaded kernel that fits its shapes
(see `registry`: exact bucket, nearest bucket, or padded/split chunks); when none fits it runs PyTorch's own
implementation, with one `NoTunedKernelWarning` per (operator, compiled fields, device). Tensors reach the kernel
through DLPack, without copies; on a GPU the kernel runs on PyTorch's current stream.

Inputs are checked first (dtype, device, shape, contiguity; indices in range and well-formed offsets, which
PyTorch checks too) unless `validate=False`: the data checks read the indices once, and on a GPU wait for it.
Errors are both the Python exception that says what is wrong (TypeError, ValueError, IndexError) and a
RuntimeError, which is what PyTorch raises for the same inputs, so callers written for either catch them.

Gradients: embedding_bag (weight, per_sample_weights) and interaction (x, ly) have backward formulas in PyTorch
ops; qmatmul takes int8 tensors and has none.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

import search_spaces

from .registry import REGISTRY, Chunk, device_key, load_default

__all__ = ["IndexOutOfRange", "InvalidDtype", "InvalidInput", "NoTunedKernelWarning", "embedding_bag",
           "interaction", "qmatmul"]


class InvalidInput(ValueError, RuntimeError):
    """A tensor of the wrong shape, device or layout, or malformed offsets."""


class InvalidDtype(TypeError, RuntimeError):
    """A tensor of the wrong dtype."""


class IndexOutOfRange(IndexError, RuntimeError):
    """An index outside the embedding table."""


class NoTunedKernelWarning(UserWarning):
    """No loaded kernel fits a call; PyTorch's implementation runs instead (warned once per workload)."""


_WARNED: set[tuple[Any, ...]] = set()
_WARN_LOCK = threading.Lock()


def _fallback(op: str, device: str, signature: tuple[Any, ...], why: str) -> None:
    key = (op, device, signature, why)
    with _WARN_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(f"autotune.{op}: {why}; running PyTorch's implementation", NoTunedKernelWarning, stacklevel=3)


def _plan(op: str, device: str, signature: tuple[Any, ...], size: int, fields: str) -> list[Chunk] | None:
    load_default()
    plan = REGISTRY.plan(op, device, signature, size)
    if plan is None:
        _fallback(op, device, signature, f"no loaded kernel for {fields} on {device}")
    return plan


def _need(cond: bool, op: str, msg: str, exc: type[Exception] = InvalidInput) -> None:
    if not cond:
        raise exc(f"autotune.{op}: {msg}")


def _same_device_contiguous(op: str, **tensors: Optional[Tensor]) -> None:
    present = {k: t for k, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    _need(len(devices) == 1, op, "all tensors must be on one device, got "
          + ", ".join(f"{k} on {t.device}" for k, t in present.items()))
    for name, t in present.items():
        _need(t.is_contiguous(), op, f"{name} must be contiguous (call .contiguous() on it)")


# ---- embedding_bag ------------------------------------------------------------------------------------------
MODES = {"sum": 0, "mean": 1, "max": 2}  # PyTorch's internal mode numbers (aten::_embedding_bag)


def check_embedding_bag(weight: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor],
                        mode: str, include_last_offset: bool, padding_idx: Optional[int]) -> None:
    """What F.embedding_bag rejects (and what would make a kernel read out of bounds), as clear errors."""
    op = "embedding_bag"
    _need(mode in MODES, op, f"mode must be one of {tuple(MODES)}, got {mode!r}")
    _need(weight.dim() == 2, op, f"weight must be 2-D (rows, dim), got shape {tuple(weight.shape)}")
    _need(weight.is_floating_point(), op, f"weight must be a floating-point tensor, got {weight.dtype}", InvalidDtype)
    for name, t in (("indices", indices), ("offsets", offsets)):
        _need(t.dtype in (torch.int32, torch.int64), op, f"{name} must be int32 or int64, got {t.dtype}", InvalidDtype)
        _need(t.dim() == 1, op, f"{name} must be 1-D, got shape {tuple(t.shape)}")
    _same_device_contiguous(op, weight=weight, indices=indices, offsets=offsets,
                            per_sample_weights=per_sample_weights)
    if per_sample_weights is not None:
        _need(mode == "sum", op, f"per_sample_weights is only supported with mode='sum', got mode={mode!r}")
        _need(per_sample_weights.dtype == weight.dtype, op,
              f"per_sample_weights must be {weight.dtype} like weight, got {per_sample_weights.dtype}", InvalidDtype)
        _need(per_sample_weights.shape == indices.shape, op,
              f"per_sample_weights must have the shape of indices {tuple(indices.shape)}, "
              f"got {tuple(per_sample_weights.shape)}")
    rows = weight.shape[0]
    if padding_idx is not None:
        _need(-rows <= padding_idx < rows, op, f"padding_idx {padding_idx} is out of range for {rows} rows")
    _need(offsets.numel() >= int(include_last_offset), op,
          "offsets must hold at least one element with include_last_offset=True")
    n = indices.numel()
    lo, hi, first, last, ordered = _index_facts(indices, offsets)
    if n:
        _need(lo >= 0 and hi < rows, op, f"indices must be in [0, {rows}), got values in [{lo}, {hi}]",
              IndexOutOfRange)
    if offsets.numel():
        _need(first == 0, op, f"offsets[0] must be 0 (the first bag starts at the first index), got {first}")
        _need(ordered, op, "offsets must be non-decreasing")
        _need(last <= n, op, f"offsets[-1] = {last} exceeds the number of indices ({n})")


def _index_facts(indices: Tensor, offsets: Tensor) -> tuple[int, int, int, int, bool]:
    """(min index, max index, offsets[0], offsets[-1], offsets non-decreasing): the data checks' inputs, read in
    one pass per tensor. On the CPU through NumPy views (a few small torch ops would cost several times more
    per call); on a GPU with one synchronisation."""
    n, b = indices.numel(), offsets.numel()
    if indices.device.type != "cpu":
        return _index_facts_device(indices, offsets)
    i, o = indices.detach().numpy(), offsets.detach().numpy()
    return (int(i.min()) if n else 0, int(i.max()) if n else 0, int(o[0]) if b else 0, int(o[-1]) if b else 0,
            bool((o[1:] >= o[:-1]).all()))


def _index_facts_device(indices: Tensor, offsets: Tensor) -> tuple[int, int, int, int, bool]:
    n, b = indices.numel(), offsets.numel()
    zero = indices.new_zeros(())
    lo, hi = torch.aminmax(indices) if n else (zero, zero)
    ends = offsets[[0, -1]].to(indices.dtype) if b else zero.expand(2)
    ordered = (offsets[1:] >= offsets[:-1]).all().to(indices.dtype)
    lo, hi, first, last, ok = torch.stack([lo, hi, ends[0], ends[1], ordered]).tolist()
    return lo, hi, first, last, bool(ok)


def _index_dtype(indices: Tensor, offsets: Tensor) -> str:
    if indices.dtype != offsets.dtype:
        return f"{indices.dtype}/{offsets.dtype}"
    return "int64" if indices.dtype == torch.int64 else "int32" if indices.dtype == torch.int32 else str(indices.dtype)


def _torch_embedding_bag(weight: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor],
                         mode: str, include_last_offset: bool, padding_idx: Optional[int]) -> Tensor:
    return F.embedding_bag(indices, weight, offsets, mode=mode, per_sample_weights=per_sample_weights,
                           include_last_offset=include_last_offset, padding_idx=padding_idx)


@torch.library.custom_op("autotune::embedding_bag", mutates_args=())
def embedding_bag(weight: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor] = None,
                  mode: str = "sum", include_last_offset: bool = False, padding_idx: Optional[int] = None,
                  validate: bool = True) -> Tensor:
    """F.embedding_bag(indices, weight, offsets, ...) with the weight first, as the kernels take it."""
    if validate:
        check_embedding_bag(weight, indices, offsets, per_sample_weights, mode, include_last_offset, padding_idx)
    rows = weight.shape[0]
    pad = padding_idx + rows if padding_idx is not None and padding_idx < 0 else padding_idx
    bags = offsets.numel() - int(include_last_offset)
    args = (weight, indices, offsets, per_sample_weights, mode, include_last_offset, padding_idx)
    if bags < 1 or indices.numel() == 0:  # nothing to gather: not worth a kernel (nor a warning)
        return _torch_embedding_bag(*args)
    dev = device_key(weight.device)
    sig = (weight.shape[1], mode, _index_dtype(indices, offsets), per_sample_weights is not None, pad,
           include_last_offset)
    if weight.dtype != torch.float32:
        _fallback("embedding_bag", dev, sig + (weight.dtype,), f"kernels take float32 tables, got {weight.dtype}")
        return _torch_embedding_bag(*args)
    if weight.device.type == "cuda" and weight.data_ptr() % 16:
        _fallback("embedding_bag", dev, sig, "the GPU kernels need a 16-byte aligned table (vector loads)")
        return _torch_embedding_bag(*args)
    plan = _plan("embedding_bag", dev, sig, bags, f"dim={sig[0]} mode={mode} index={sig[2]} "
                 f"per_sample_weights={sig[3]} padding_idx={pad} include_last_offset={include_last_offset}")
    if plan is None:
        return _torch_embedding_bag(*args)
    tensors = (weight, indices, offsets) + (() if per_sample_weights is None else (per_sample_weights,))
    return plan[0].kernel(*tensors)


@embedding_bag.register_fake
def _(weight, indices, offsets, per_sample_weights=None, mode="sum", include_last_offset=False, padding_idx=None,
      validate=True):
    return weight.new_empty(offsets.shape[0] - int(include_last_offset), weight.shape[1])


def _embedding_bag_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    weight, indices, offsets, psw, mode, include_last_offset, padding_idx, _ = inputs
    ctx.save_for_backward(weight, indices, offsets, psw)
    ctx.options = (mode, include_last_offset, padding_idx)


def _embedding_bag_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    """PyTorch's own backward (aten::_embedding_bag_backward), after recomputing the bag bookkeeping it needs
    (bag of each index, bag sizes, argmax for mode=max) with aten::_embedding_bag: a training step pays one
    PyTorch forward more."""
    weight, indices, offsets, psw = ctx.saved_tensors
    mode, include_last_offset, padding_idx = ctx.options
    pad = -1 if padding_idx is None else padding_idx + weight.shape[0] if padding_idx < 0 else padding_idx
    m = MODES[mode]
    _, offset2bag, bag_size, max_indices = torch.ops.aten._embedding_bag(
        weight.detach(), indices, offsets, False, m, False, psw, include_last_offset, pad)
    grad_weight = grad_psw = None
    if ctx.needs_input_grad[0]:
        grad_weight = torch.ops.aten._embedding_bag_backward(
            grad, indices, offsets, offset2bag, bag_size, max_indices, weight.shape[0], False, m, False, psw, pad)
    if psw is not None and ctx.needs_input_grad[3]:
        grad_psw = torch.ops.aten._embedding_bag_per_sample_weights_backward(
            grad, weight, indices, offsets, offset2bag, m, pad)
    return grad_weight, None, None, grad_psw, None, None, None, None


embedding_bag.register_autograd(_embedding_bag_backward, setup_context=_embedding_bag_setup)


# ---- interaction ----------------------------------------------------------------------------------------------
def check_interaction(x: Tensor, ly: Tensor) -> None:
    op = "interaction"
    _need(x.dim() == 2, op, f"x must be 2-D (batch, dim), got shape {tuple(x.shape)}")
    _need(ly.dim() == 3, op, f"ly must be 3-D (batch, tables, dim): the embeddings stacked, got {tuple(ly.shape)}")
    _need(x.is_floating_point() and ly.dtype == x.dtype, op,
          f"x and ly must be floating point of one dtype, got {x.dtype} and {ly.dtype}", InvalidDtype)
    _need(ly.shape[0] == x.shape[0] and ly.shape[2] == x.shape[1], op,
          f"ly must be ({x.shape[0]}, tables, {x.shape[1]}) for x of shape {tuple(x.shape)}, got {tuple(ly.shape)}")
    _same_device_contiguous(op, x=x, ly=ly)


def _pairs(features: Any, self_interaction: bool) -> Any:
    return features * (features + 1) // 2 if self_interaction else features * (features - 1) // 2


def _torch_interaction(x: Tensor, ly: Tensor, self_interaction: bool) -> Tensor:
    """DLRM's interact_features on stacked embeddings."""
    t = torch.cat([x.unsqueeze(1), ly], dim=1)
    z = torch.bmm(t, t.transpose(1, 2))
    f = t.shape[1]
    li, lj = torch.tril_indices(f, f, offset=0 if self_interaction else -1, device=x.device)
    return torch.cat([x, z[:, li, lj]], dim=1)


@torch.library.custom_op("autotune::interaction", mutates_args=())
def interaction(x: Tensor, ly: Tensor, self_interaction: bool = False, validate: bool = True) -> Tensor:
    """DLRM's dot interaction: cat([x, tril(T T^T)]) with T = [x, ly[:, 0], ..., ly[:, tables-1]] per sample."""
    if validate:
        check_interaction(x, ly)
    batch, tables, dim = ly.shape
    if batch < 1:
        return _torch_interaction(x, ly, self_interaction)
    dev = device_key(x.device)
    sig = (tables, dim, self_interaction, "dot")
    if x.dtype != torch.float32:
        _fallback("interaction", dev, sig + (x.dtype,), f"kernels take float32, got {x.dtype}")
        return _torch_interaction(x, ly, self_interaction)
    if x.device.type == "cuda" and batch * max(tables * dim, dim + _pairs(tables + 1, self_interaction)) >= 2**31:
        _fallback("interaction", dev, sig + ("large",), f"batch {batch} overflows the GPU kernels' 32-bit indexing")
        return _torch_interaction(x, ly, self_interaction)
    plan = _plan("interaction", dev, sig, batch, f"tables={tables} dim={dim} self_interaction={self_interaction}")
    if plan is None:
        return _torch_interaction(x, ly, self_interaction)
    return plan[0].kernel(x, ly)


@interaction.register_fake
def _(x, ly, self_interaction=False, validate=True):
    return x.new_empty(x.shape[0], x.shape[1] + _pairs(ly.shape[1] + 1, self_interaction))


def _interaction_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, ly, self_interaction, _ = inputs
    ctx.save_for_backward(x, ly)
    ctx.self_interaction = self_interaction


def _interaction_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    """Z = T T^T, so dL/dT = (G + G^T) T where G holds the kept pairs' gradients (zero elsewhere)."""
    x, ly = ctx.saved_tensors
    t = torch.cat([x.unsqueeze(1), ly], dim=1)
    b, f, d = t.shape
    li, lj = torch.tril_indices(f, f, offset=0 if ctx.self_interaction else -1, device=x.device)
    g = grad.new_zeros(b, f * f).index_copy(1, li * f + lj, grad[:, d:].contiguous()).view(b, f, f)
    gt = torch.bmm(g + g.transpose(1, 2), t)
    return grad[:, :d] + gt[:, 0], gt[:, 1:], None, None


interaction.register_autograd(_interaction_backward, setup_context=_interaction_setup)


# ---- qmatmul --------------------------------------------------------------------------------------------------
def check_qmatmul(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor,
                  bias: Optional[Tensor]) -> None:
    op = "qmatmul"
    _need(a.dim() == 2, op, f"a must be 2-D (m, k), got shape {tuple(a.shape)}")
    _need(a.dtype in (torch.int8, torch.float32), op,
          f"a must be int8 (with a_scale) or float32 (weight-only), got {a.dtype}", InvalidDtype)
    _need(weight.dtype == torch.int8, op, f"weight must be int8, got {weight.dtype}", InvalidDtype)
    _need(weight.dim() == 2 and weight.shape[1] == a.shape[1], op,
          f"weight must be (n, {a.shape[1]}) like nn.Linear's for a of shape {tuple(a.shape)}, "
          f"got {tuple(weight.shape)}")
    m, n = a.shape[0], weight.shape[0]
    if a.dtype == torch.int8:
        _need(a_scale is not None, op, "int8 activations need a_scale (one float32 scale per row)")
    else:
        _need(a_scale is None, op, "float32 activations (weight-only) take no a_scale")
    for name, t, size in (("a_scale", a_scale, m), ("w_scale", w_scale, n), ("bias", bias, n)):
        if t is not None:
            _need(t.dtype == torch.float32, op, f"{name} must be float32, got {t.dtype}", InvalidDtype)
            _need(tuple(t.shape) == (size,), op, f"{name} must be ({size},), got {tuple(t.shape)}")
    _same_device_contiguous(op, a=a, weight=weight, a_scale=a_scale, w_scale=w_scale, bias=bias)


def _qmatmul_workload(a: Tensor, weight: Tensor, bias: Optional[Tensor], relu: bool) -> Any:
    return search_spaces.get("qmatmul").Workload(
        m=a.shape[0], k=a.shape[1], n=weight.shape[0], mode="int8" if a.dtype == torch.int8 else "weight_only",
        bias=bias is not None, relu=relu)


def _torch_qmatmul(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor, bias: Optional[Tensor],
                   relu: bool) -> Tensor:
    if a.shape[0] == 0:
        return a.new_empty(0, weight.shape[0], dtype=torch.float32)
    tensors = [t for t in (a, weight, a_scale, w_scale, bias) if t is not None]
    return search_spaces.get("qmatmul").reference(_qmatmul_workload(a, weight, bias, relu), *tensors)


def _run_chunk(chunk: Chunk, a: Tensor, weight: Tensor, a_scale: Optional[Tensor], rest: list[Tensor]) -> Tensor:
    """Rows [start, stop) through a kernel tuned for `chunk.kernel.size` rows, zero-padded up to it."""
    rows, pad = chunk.stop - chunk.start, chunk.kernel.size - (chunk.stop - chunk.start)
    a_c = a[chunk.start:chunk.stop]
    s_c = None if a_scale is None else a_scale[chunk.start:chunk.stop]
    if pad:
        a_c = F.pad(a_c, (0, 0, 0, pad))
        s_c = None if s_c is None else F.pad(s_c, (0, pad))
    out = chunk.kernel(a_c, weight, *([] if s_c is None else [s_c]), *rest)
    return out[:rows] if pad else out


@torch.library.custom_op("autotune::qmatmul", mutates_args=())
def qmatmul(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor, bias: Optional[Tensor] = None,
            relu: bool = False, validate: bool = True) -> Tensor:
    """relu?((a @ weight.T) * a_scale[:, None] * w_scale + bias) with int8 a and weight (int32 accumulation),
    or with float32 a and no a_scale (weight-only). The weight is packed once per kernel and weight tensor."""
    if validate:
        check_qmatmul(a, weight, a_scale, w_scale, bias)
    m, (n, k) = a.shape[0], weight.shape
    mode = "int8" if a.dtype == torch.int8 else "weight_only"
    if m < 1:
        return _torch_qmatmul(a, weight, a_scale, w_scale, bias, relu)
    dev = device_key(a.device)
    sig = (k, n, mode, bias is not None, relu)
    plan = _plan("qmatmul", dev, sig, m, f"k={k} n={n} mode={mode} bias={bias is not None} relu={relu}")
    if plan is None:
        return _torch_qmatmul(a, weight, a_scale, w_scale, bias, relu)
    rest = [w_scale] + ([] if bias is None else [bias])
    if len(plan) == 1:
        return _run_chunk(plan[0], a, weight, a_scale, rest).contiguous()
    out = a.new_empty(m, n, dtype=torch.float32)
    for chunk in plan:
        out[chunk.start:chunk.stop] = _run_chunk(chunk, a, weight, a_scale, rest)
    return out


@qmatmul.register_fake
def _(a, weight, a_scale, w_scale, bias=None, relu=False, validate=True):
    return a.new_empty(a.shape[0], weight.shape[0], dtype=torch.float32)
