"""Row-wise symmetric int8 quantization: workload, semantics, inputs, kernel arguments. No TVM import.

Per row r of a float32 (rows, cols) matrix x, with qmax the workload's range (127 by default):
    scale[r] = max(max_c |x[r, c]|, 1e-12) / qmax                       (float32, IEEE division)
    q[r, c]  = clamp(round_half_even(x[r, c] / scale[r]), -qmax, qmax)  (int8; a division, not x * (1/scale))
the activation quantization of an int8 MLP layer (the `a`, `a_scale` of qmatmul). qmax=63 gives 7-bit
activations, for int8 kernels built on AVX2's `vpmaddubsw` (u8 x s8 pairs summed in saturating int16), which
full-range activations overflow (FBGEMM's `reduce_range` exists for the same reason). Every step is exact or one
correctly rounded IEEE operation, so a kernel that divides (and rounds half to even, as torch.round does)
reproduces PyTorch bit for bit: the tolerance is zero. Multiplying by the reciprocal instead differs in the last
bit of x / scale, which moves q by one where the quotient sits at a .5 boundary. Inputs are finite: NaN and
infinities have no meaningful int8 image (PyTorch's cast of NaN is undefined). With `smooth`, x is first
multiplied by a float32 factor per column (one rounding, as `x * smooth` in PyTorch): a smoothed int8 layer's
input (SmoothQuant) quantized in the same pass, the product never written. With `dtype="bfloat16"` x is bfloat16
rows (a DCN cross network's state stored in 16 bits, qmatmul/graph.py), widened to float32 exactly as read: the
result is that of the float32 rows `x.float()`. CPUs only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..space import Config
from ..template import Traffic, Workload as _Workload, WorkloadError

QMAX = 127  # the default symmetric range [-127, 127]: -128 is never produced, so negation stays in range
# The smallest range: 1 would be ternary, and it is what the op's old call `quantize_rows(x, True)` (validate,
# before qmax came second) turns into; refusing it makes that call an error instead of silently ternary output.
QMIN = 2
EPS = 1e-12  # smallest row max: an all-zero row gets a tiny positive scale (and q = 0), not a division by 0
DTYPES = ("float32", "bfloat16")  # what x may be (bfloat16 on CPUs only)


@dataclass(frozen=True)
class Workload(_Workload):
    """One call: `rows` activation rows (the batch: any number at run time, tuned for this one) of `cols`,
    quantized to [-qmax, qmax] (compiled into the kernel: 63 for 7-bit activations)."""

    rows: int
    cols: int
    qmax: int = QMAX
    # x's columns multiplied by a factor each before quantizing (SmoothQuant's 1/s for the next int8 layer,
    # fused: the product is rounded as PyTorch's multiply rounds it, and never written out)
    smooth: bool = False
    # x's dtype: bfloat16 rows are widened to float32 as they are read (exact), half float32's traffic
    dtype: str = "float32"

    KEY_DEFAULTS = {"dtype": "float32"}  # records older than the field meant float32 rows

    def __post_init__(self) -> None:
        for name in ("rows", "cols", "qmax"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise WorkloadError(f"{name} must be an integer, got {value!r}")
            if value < 1 and name != "qmax":
                raise WorkloadError(f"{name} must be >= 1, got {value}")
        if not QMIN <= self.qmax <= QMAX:
            raise WorkloadError(f"qmax must be in [{QMIN}, {QMAX}] (q is int8, symmetric), got {self.qmax}")
        if not isinstance(self.smooth, bool):
            raise WorkloadError(f"smooth must be a bool, got {self.smooth!r}")
        if self.dtype not in DTYPES:
            raise WorkloadError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


def quantize_rows(x: Any, qmax: int = QMAX, smooth: Any = None) -> tuple[Any, Any]:
    """The semantics on a tensor (any rows, device): (q int8 in [-qmax, qmax], scale float32 per row) of x (bfloat16
    rows as `x.float()`), or of `x * smooth` (a factor per column) where given.

    The torch op's PyTorch implementation and the reference kernels are checked against."""
    import torch

    if x.dtype == torch.bfloat16:
        x = x.float()  # exact; the scale and quotients are float32 arithmetic, not bfloat16's
    if smooth is not None:
        x = x * smooth

    amax = x.abs().amax(dim=1).clamp_min(EPS)
    # divided by a tensor, not a Python number: on a GPU PyTorch turns division by a scalar into a multiplication
    # by its reciprocal, one ulp off the IEEE quotient for some rows (and q one off where x / scale sits at .5)
    scale = amax / torch.full_like(amax, float(qmax))
    return torch.round(x / scale[:, None]).clamp_(-qmax, qmax).to(torch.int8), scale


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(x,): activations of mixed magnitude per row (rows' scales differ by orders of magnitude, as after a
    layer whose units fire unevenly), torch tensors of the workload's dtype on the CPU."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.pow(10.0, torch.empty(w.rows, 1).uniform_(-3, 3, generator=gen))
    x = (torch.randn(w.rows, w.cols, generator=gen) * magnitude).to(getattr(torch, w.dtype))
    # smoothing factors as SmoothQuant's span: a decade each way
    return (x, torch.pow(10.0, torch.empty(w.cols).uniform_(-1, 1, generator=gen))) if w.smooth else (x,)


def reference(w: Workload, x: Any, smooth: Any = None) -> tuple[Any, Any]:
    return quantize_rows(x, w.qmax, smooth)


def baselines(w: Workload, x: Any, smooth: Any = None) -> dict[str, Callable[[], Any]]:
    """PyTorch's eager paths: the reference as written (six ops, four temporaries; seven and five smoothed) and
    the same steps with one temporary updated in place (what a careful eager implementation does)."""
    import torch

    def in_place() -> tuple[Any, Any]:
        y = x if smooth is None else x * smooth
        scale = torch.amax(y.abs(), dim=1).clamp_min_(EPS).div_(float(w.qmax))
        t = torch.div(y, scale[:, None])
        return t.round_().clamp_(-w.qmax, w.qmax).to(torch.int8), scale

    return {"torch eager": lambda: quantize_rows(x, w.qmax, smooth), "torch eager (in place)": in_place}


def pack(w: Workload, cfg: Config, *weights: Any) -> tuple[Any, ...]:
    """Nothing to pack: the input is an activation (WEIGHTS is empty)."""
    return weights


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], x: Any, smooth: Any = None
                ) -> tuple[Sequence[Any], Any]:
    """(x, [smooth], q, scale) with the outputs allocated on x's device, and the output pair (q, scale)."""
    import torch

    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    return [x, *([] if smooth is None else [smooth]), q, scale], (q, scale)


def traffic(w: Workload, x: Any, smooth: Any = None) -> Traffic:
    """Bytes that must cross the bus once: x read (4 B, 2 in bfloat16), q written (1 B), one scale per row (4 B),
    the factors."""
    rows = x.shape[0]
    per_value = (2 if w.dtype == "bfloat16" else 4) + 1
    return Traffic(bytes=float(rows * w.cols * per_value + rows * 4 + (w.cols * 4 if w.smooth else 0)), ops=0.0,
                   unit="GB/s")


def tolerance(w: Workload) -> tuple[float, float]:
    """Exact: the max is exact and each division is one correctly rounded IEEE operation, as in PyTorch."""
    return (0.0, 0.0)
