"""qmatmul_cross_requant's workload and semantics: qmatmul_cross's (qmatmul_cross/workload.py), then
quantize_rows' on its output, for the next int8 layer.

    y        = x0 * qmatmul(a, weight, a_scale, w_scale, bias) + x     (float32, M x N)
    q, scale = quantize_rows(y, out_qmax)                              (int8 M x N, float32 M)

In DLRMv2's cross network each layer's output y is both the next layer's residual x (float32) and the input of
its int8 V product (quantized per row); after the last layer it is only the next MLP's input. `out_float`
says whether y leaves the kernel: False where the quantized rows are its only use. `smooth`: the next layer is
smoothed (SmoothQuant, qmatmul/graph.py), so its rows are those of `y * smooth`, a factor per column given as the
last tensor, as quantize_rows' `smooth`; y itself is not scaled.

y agrees with qmatmul_cross's within its tolerance, not bit for bit, so q may differ by one step where
y / scale sits at a rounding boundary (as qmatmul_requant's). No tvm import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..qmatmul import workload as _qmatmul
from ..qmatmul_cross import workload as _cross
from ..quantize_rows.workload import QMAX, QMIN, quantize_rows
from ..template import Traffic, WorkloadError

__all__ = ["Workload", "baselines", "inputs", "kernel_args", "outputs", "reference", "split", "timed_inputs",
           "tolerance", "traffic"]


@dataclass(frozen=True)
class Workload(_cross.Workload):
    """qmatmul_cross's fields, `out_qmax` (the rows' range [-out_qmax, out_qmax]: y has no ReLU, so no uint8
    rows), `out_float` (whether y itself is an output too) and `smooth` (the rows quantized are y's times a
    factor per column)."""

    out_qmax: int = QMAX
    out_float: bool = True
    smooth: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.out_qmax, bool) or not isinstance(self.out_qmax, int) or not QMIN <= self.out_qmax <= QMAX:
            raise WorkloadError(f"out_qmax must be an integer in [{QMIN}, {QMAX}] (a cross layer's output is "
                                f"signed), got {self.out_qmax!r}")
        for name in ("out_float", "smooth"):
            if not isinstance(getattr(self, name), bool):
                raise WorkloadError(f"{name} must be a bool, got {getattr(self, name)!r}")


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """qmatmul_cross's (A, W, a_scale, w_scale[, bias], x0, x), then the column factors where smoothed (a decade
    each way, as SmoothQuant's span)."""
    import torch

    tensors = _cross.inputs(w, seed)
    if not w.smooth:
        return tensors
    g = torch.Generator().manual_seed(seed + 2)
    return (*tensors, torch.pow(10.0, torch.empty(w.n).uniform_(-1, 1, generator=g)))


def split(w: Workload, tensors: Sequence[Any]) -> tuple[Sequence[Any], Any]:
    """qmatmul_cross's tensors, and the column factors (None unless smoothed)."""
    return (tensors[:-1], tensors[-1]) if w.smooth else (tensors, None)


def timed_inputs(w: Workload, seed: int, tensors: tuple[Any, ...], cache_bytes: int) -> tuple[tuple[Any, ...], ...]:
    """qmatmul_cross's: new x0 and x for each timed call (a model's cross layer reads them from memory)."""
    cross, smooth = split(w, tensors)
    sets = _cross.timed_inputs(w, seed, tuple(cross), cache_bytes)
    return sets if smooth is None else tuple((*s, smooth) for s in sets)


def outputs(w: Workload, y: Any, smooth: Any = None) -> tuple[Any, ...]:
    """(y, q, scale), or (q, scale) without `out_float`, from the cross layer's output y (its rows times
    `smooth` quantized, where given)."""
    q, scale = quantize_rows(y, w.out_qmax, smooth)
    return (y, q, scale) if w.out_float else (q, scale)


def reference(w: Workload, *tensors: Any) -> tuple[Any, ...]:
    cross, smooth = split(w, tensors)
    return outputs(w, _cross.reference(w, *cross), smooth)


def baselines(w: Workload, *tensors: Any) -> dict[str, Callable[[], Any]]:
    """What eager PyTorch runs: qmatmul_cross's paths (qmatmul, then the tail), then the row quantization."""
    cross, smooth = split(w, tensors)
    return {name: (lambda f=f: outputs(w, f(), smooth)) for name, f in _cross.baselines(w, *cross).items()}


def kernel_args(w: Workload, dims: tuple[int, int, int], packed: Sequence[Any], *tensors: Any
                ) -> tuple[list[Any], Any]:
    """(A, *packed, a_scale, w_scale, bias?, X0, X, [smooth], [Y], Q, S) for the padded `dims`, and what the
    caller gets: views of the (M, N) and (M,) corners (padded rows and channels are computed and dropped)."""
    import torch

    cross, smooth = split(w, tensors)
    args, y = _cross.kernel_args(w, dims, packed, *cross)
    mp, _, np_ = dims
    if smooth is not None:  # padded channels are 0 in y: any factor keeps them 0
        args.insert(len(args) - 1, torch.nn.functional.pad(smooth, (0, np_ - w.n)) if np_ != w.n else smooth)
    q = torch.empty(mp, np_, dtype=torch.int8, device=y.device)
    scale = torch.empty(mp, dtype=torch.float32, device=y.device)
    whole = (mp, np_) == (w.m, w.n)
    q_out, scale_out = (q, scale) if whole else (q[: w.m, : w.n], scale[: w.m])
    if w.out_float:
        return [*args, q, scale], (y, q_out, scale_out)
    return [*args[:-1], q, scale], (q_out, scale_out)


def traffic(w: Workload, *tensors: Any) -> Traffic:
    """qmatmul_cross's, with int8 rows and their scales written too (instead of y without `out_float`)."""
    t = _cross.traffic(w, *tensors)
    written = w.m * w.n + w.m * 4 - (0 if w.out_float else w.m * w.n * 4)
    return Traffic(bytes=t.bytes + written + (w.n * 4 if w.smooth else 0), ops=t.ops, unit=t.unit)


def tolerance(w: Workload) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(rtols, atols), one per output (`runtime.mismatch`): y within qmatmul's error, q within one step, the
    scale within qmatmul's relative error (as qmatmul_requant's)."""
    rtol, atol = _qmatmul.tolerance(w)
    y_rtol, y_atol = ((rtol,), (atol,)) if w.out_float else ((), ())
    return (*y_rtol, 0.0, rtol), (*y_atol, 1.0, atol / w.out_qmax)
