"""What the embedding bag accepts, as clear errors: the torch op's checks of F.embedding_bag's semantics, and the
template's `check_inputs`, which adds what one compiled kernel needs.

Metadata only (dtypes, shapes, devices, options, row widths: no pass over the data), on every validated call of
the torch op; the data checks (indices in range, well-formed offsets) are workload.py's `check_data`, which the
CPU kernels' flag is explained with. Imports torch (its dtypes, compared on every call), so workload.py never
imports this module: it sits between the workload and the torch op (torch_op.py), and the package's
`check_inputs` imports it on first use.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from .._torch_checks import fits, need, same_device_contiguous
from ..template import InvalidDtype
from .rows import FUSED_BYTES
from .workload import MODES, Workload, check_data, check_index_tensors, check_table, check_tensors, needs

__all__ = ["check", "check_inputs", "explain_table", "out_dtype", "table_ok"]

OP = "embedding_bag"


def check(weight: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor] = None,
          mode: str = "sum", include_last_offset: bool = False, padding_idx: Optional[int] = None,
          validate: bool = True) -> None:
    """What F.embedding_bag rejects (and what would make a kernel read out of bounds), as clear errors.

    On the CPU only the metadata is checked here (dtypes, shapes, devices, options: no pass over the data):
    the kernels check every index and bag as they gather and `after_call` raises what they met, and PyTorch's
    own implementation, where a call falls back to it, checks them itself (the torch op adds the check
    PyTorch lacks). CUDA inputs are also checked here, on the host, before the call: reading a GPU kernel's
    flag would wait for it (its kernels clamp what they read, so unchecked input stays inside the tensors)."""
    ws, ids, ofs = weight.shape, indices.shape, offsets.shape
    if (len(ws) == 2 and len(ids) == 1 and len(ofs) == 1 and indices.dtype in _INDEX and offsets.dtype in _INDEX
            and mode in MODES and ofs[0] >= include_last_offset and table_ok(weight)
            and (per_sample_weights is None or (mode == "sum" and per_sample_weights.dtype is out_dtype(weight)
                                                and per_sample_weights.shape == ids))
            and (padding_idx is None or -ws[0] <= padding_idx < ws[0])
            and fits(weight, indices, offsets, per_sample_weights)):
        if weight.is_cpu:
            return  # the kernels check the data as they gather
    else:
        _explain(weight, indices, offsets, per_sample_weights, mode, include_last_offset, padding_idx)
    check_data(ws[0], indices, offsets)


_INDEX = (torch.int32, torch.int64)
_REDUCED = (torch.float16, torch.bfloat16, torch.uint8)  # rows.py's reduced-precision storage


def table_ok(weight: Tensor) -> bool:
    """A float32 or float64 table (PyTorch's), or a reduced-precision one (rows.py) that no gradient is asked of,
    uint8 rows wide enough for their scale and bias."""
    if weight.dtype is torch.float32 or weight.dtype is torch.float64:
        return True
    return weight.dtype in _REDUCED and not weight.requires_grad and (
        weight.dtype is not torch.uint8 or (weight.shape[1] > FUSED_BYTES and weight.shape[1] % 4 == 0))


def out_dtype(weight: Tensor) -> torch.dtype:
    """The output's (and per-sample weights') dtype: float32, float64 for a float64 table (PyTorch's way)."""
    return torch.float64 if weight.dtype is torch.float64 else torch.float32


def explain_table(op: str, weight: Tensor) -> None:
    """Why a 2-D table is not one `table_ok` takes, as a clear error of operator `op`."""
    need(weight.dtype in (torch.float32, torch.float64) + _REDUCED, op, "weight must be float32, float64, float16, "
         f"bfloat16 or uint8 (FBGEMM's fused int8 rows), got {weight.dtype}", InvalidDtype)
    if weight.dtype in _REDUCED:
        need(not weight.requires_grad, op, f"a {weight.dtype} table is for inference: it cannot take a gradient "
             "(train in float32, then quantize)")
    if weight.dtype is torch.uint8:
        need(weight.shape[1] > FUSED_BYTES and weight.shape[1] % 4 == 0, op,
             f"uint8 weight must hold FBGEMM's fused int8 rows (dim values, then a float32 scale and bias: "
             f"dim + 8 bytes, dim % 4 == 0), got rows of {weight.shape[1]} bytes")


def _explain(weight: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor], mode: str,
             include_last_offset: bool, padding_idx: Optional[int]) -> None:
    need(mode in MODES, OP, f"mode must be one of {MODES}, got {mode!r}")
    need(weight.dim() == 2, OP, f"weight must be 2-D (rows, dim), got shape {tuple(weight.shape)}")
    explain_table(OP, weight)
    for name, t in (("indices", indices), ("offsets", offsets)):
        need(t.dtype in _INDEX, OP, f"{name} must be int32 or int64, got {t.dtype}", InvalidDtype)
        need(t.dim() == 1, OP, f"{name} must be 1-D, got shape {tuple(t.shape)}")
    same_device_contiguous(OP, weight=weight, indices=indices, offsets=offsets, per_sample_weights=per_sample_weights)
    if per_sample_weights is not None:
        need(mode == "sum", OP, f"per_sample_weights is only supported with mode='sum', got mode={mode!r}")
        need(per_sample_weights.dtype == out_dtype(weight), OP, f"per_sample_weights must be "
             f"{out_dtype(weight)} for a {weight.dtype} weight, got {per_sample_weights.dtype}", InvalidDtype)
        need(per_sample_weights.shape == indices.shape, OP,
             f"per_sample_weights must have the shape of indices {tuple(indices.shape)}, "
             f"got {tuple(per_sample_weights.shape)}")
    rows = weight.shape[0]
    if padding_idx is not None:
        need(-rows <= padding_idx < rows, OP, f"padding_idx {padding_idx} is out of range for {rows} rows")
    need(offsets.numel() >= int(include_last_offset), OP,
         "offsets must hold at least one element with include_last_offset=True")


_need = needs("embedding_bag")


def check_inputs(w: Workload, weight: Any, indices: Any, offsets: Any, per_sample_weights: Any = None) -> None:
    """Raise a clear error for tensors that would make the kernel read out of bounds or compute garbage: first
    what this workload's kernel needs (dtypes, dimension, options compiled in), then F.embedding_bag's own
    semantics (`check`, and here also on the CPU the data checks the kernel makes itself: indices in range,
    well-formed offsets), so that bad input never reaches the kernel."""
    tensors = {"weight": weight, "indices": indices, "offsets": offsets}
    if per_sample_weights is not None:
        tensors["per_sample_weights"] = per_sample_weights
    check_tensors(_need, tensors)
    check_table(_need, weight, w.rows_format, "rows")
    check_index_tensors(_need, w.index_dtype, indices, offsets)
    _need(offsets.numel() >= 1 + int(w.include_last_offset), "offsets is too short for one bag")
    if w.per_sample_weights:
        _need(per_sample_weights is not None, "this kernel was tuned with per_sample_weights; pass them")
    else:
        _need(per_sample_weights is None, "this kernel was tuned without per_sample_weights")
    check(weight, indices, offsets, per_sample_weights, w.mode, w.include_last_offset, w.padding_idx)
    if indices.device.type == "cpu":  # (check itself reads a GPU's indices)
        check_data(weight.shape[0], indices, offsets)
