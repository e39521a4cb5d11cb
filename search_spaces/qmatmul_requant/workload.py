"""qmatmul_requant's workload and semantics: qmatmul's (qmatmul/workload.py), then quantize_rows' on its output.

    y        = qmatmul(a, weight, a_scale, w_scale, bias, relu)        (float32, M x N; never leaves the kernel)
    q, scale = quantize_rows(y, out_qmax)                              (int8 M x N, float32 M)

out_qmax=255 (a ReLU's output, y >= 0): uint8 rows in [0, 255], scale = max(max_c y, 1e-12) / 255, for a next
layer of mode uint8 (CPUs only).

The kernel's y agrees with PyTorch's within qmatmul's tolerance, not bit for bit (its epilogue's multiply-add
may be one fused instruction), so q may differ by one step where y / scale sits at a rounding boundary: the
tolerance allows one step on q and qmatmul's relative error on the scale. No tvm import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..qmatmul import workload as _qmatmul
from ..qmatmul.workload import UNSIGNED_QMAX, quantize_unsigned_rows
from ..quantize_rows.workload import QMAX, QMIN, quantize_rows
from ..template import Traffic, WorkloadError

__all__ = ["UNSIGNED_QMAX", "Workload", "baselines", "inputs", "kernel_args", "quantize_output", "reference",
           "tolerance", "traffic"]


@dataclass(frozen=True)
class Workload(_qmatmul.Workload):
    """qmatmul's fields and `out_qmax`, the range [-out_qmax, out_qmax] the output rows are quantized to (63:
    7-bit activations for the next layer's AVX2 kernel; 127: all 8 bits), or 255: [0, 255] as uint8, after a
    ReLU."""

    out_qmax: int = QMAX

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.out_qmax, bool) or not isinstance(self.out_qmax, int) or not (
                QMIN <= self.out_qmax <= QMAX or self.out_qmax == UNSIGNED_QMAX):
            raise WorkloadError(f"out_qmax must be an integer in [{QMIN}, {QMAX}], or {UNSIGNED_QMAX} (uint8 rows), "
                                f"got {self.out_qmax!r}")
        if self.out_qmax == UNSIGNED_QMAX and not self.relu:
            raise WorkloadError(f"out_qmax {UNSIGNED_QMAX} (uint8 rows) needs relu: the outputs must be >= 0")


def quantize_output(y: Any, out_qmax: int) -> tuple[Any, Any]:
    """(q, scale) of the rows of y: quantize_rows' for a signed range, uint8 rows for UNSIGNED_QMAX (y >= 0)."""
    return quantize_unsigned_rows(y, out_qmax) if out_qmax == UNSIGNED_QMAX else quantize_rows(y, out_qmax)


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    return _qmatmul.inputs(w, seed)


def reference(w: Workload, *tensors: Any) -> tuple[Any, Any]:
    return quantize_output(_qmatmul.reference(w, *tensors), w.out_qmax)


def baselines(w: Workload, *tensors: Any) -> dict[str, Callable[[], Any]]:
    """What an eager int8 MLP runs: the reference, and qmatmul's PyTorch paths followed by the row quantization.
    Not fbgemm's quantized.linear: it requantizes the whole output to one scale, so rows of small values lose
    the per-row precision this op keeps (3 steps of 63 off in the test shape): another computation."""
    out: dict[str, Callable[[], Any]] = {"torch eager": lambda: reference(w, *tensors)}
    for name, f in _qmatmul.baselines(w, *tensors).items():
        if "fbgemm" not in name:
            out[f"{name} + quantize_rows"] = lambda f=f: quantize_output(f(), w.out_qmax)
    return out


def kernel_args(w: Workload, dims: tuple[int, int, int], packed: Sequence[Any], *tensors: Any
                ) -> tuple[list[Any], Any]:
    """(A, *packed, a_scale?, w_scale, bias?, Q, S) for the padded `dims`, and the (q, scale) the caller gets:
    views of the (M, N) and (M,) corners (padded rows and channels are quantized and dropped)."""
    import torch

    mp, _, np_ = dims
    m = tensors[0].shape[0]
    args = _qmatmul.padded_inputs(w, dims, packed, *tensors)
    q = torch.empty(mp, np_, dtype=torch.uint8 if w.out_qmax == UNSIGNED_QMAX else torch.int8, device=args[0].device)
    scale = torch.empty(mp, dtype=torch.float32, device=args[0].device)
    out = (q, scale) if (mp, np_) == (m, w.n) else (q[:m, : w.n], scale[:m])
    return [*args, q, scale], out


def traffic(w: Workload, *tensors: Any) -> Traffic:
    """qmatmul's, with an int8 output and one scale per row instead of float32 outputs."""
    t = _qmatmul.traffic(w, *tensors)
    return Traffic(bytes=t.bytes - w.m * w.n * 3 + w.m * 4, ops=t.ops, unit=t.unit)


def tolerance(w: Workload) -> tuple[tuple[float, float], tuple[float, float]]:
    """(rtol, atol), each a pair for the outputs (q, scale) (`runtime.mismatch`): q within one step (see the
    module doc), the scale within qmatmul's error. Exactness where y is exact (power-of-two scales) is pinned by
    a test."""
    rtol, atol = _qmatmul.tolerance(w)
    return (0.0, rtol), (1.0, atol / w.out_qmax)
