"""A float32 Linear (+ ReLU) at float32 accuracy: workload, semantics, inputs, kernel arguments. No TVM import.

    Y = relu?(X @ W.T + b)      X (M, K), W (N, K) as nn.Linear stores it, b (N,), all float32

The kernels (cpu.py) may compute the products from bf16 pieces of X and W on AMX tiles: each operand is split
into three bf16 numbers whose sum is the float32 value exactly (8 + 8 + 8 significant bits: the float32's 24),
and the six products of pieces down to 2^-16 of the term are summed in float32 (the three dropped, mid x lo,
lo x mid and lo x lo, are 2^-24 of it and below: float32's own rounding). So the result carries the error of a
float32 dot product, not of a bf16 one: judged, as PyTorch's own float32 GEMM, against float64 within the
bound of a K-term float32 sum (`tolerance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..space import Config
from ..template import Traffic, Workload as _Workload, WorkloadError

PIECES = 3  # bf16 pieces per float32 operand: 3 x 8 significant bits hold its 24
U = 2.0 ** -24  # float32's unit roundoff


@dataclass(frozen=True)
class Workload(_Workload):
    """One layer: `m` rows of `k` features (the batch; a kernel takes any number of rows, tuned for this one)
    into `n` outputs, with a bias or not, a ReLU after it or not."""

    m: int
    k: int
    n: int
    bias: bool = True
    relu: bool = False

    def __post_init__(self) -> None:
        for name in ("m", "k", "n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("bias", "relu"):
            if not isinstance(getattr(self, name), bool):
                raise WorkloadError(f"{name} must be a bool, got {getattr(self, name)!r}")


def linear(x: Any, weight: Any, bias: Any = None, relu: bool = False) -> Any:
    """The semantics on tensors of any float dtype (float64 under the float64 rule)."""
    import torch
    import torch.nn.functional as F

    y = F.linear(x, weight, bias)
    return torch.relu(y) if relu else y


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(x, weight[, bias]): a ReLU layer's activations (half zeros, the rest of unit scale) and nn.Linear's
    initialisation (uniform within 1/sqrt(k)), torch float32 on the CPU."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(w.m, w.k, generator=gen).relu_()
    bound = w.k ** -0.5
    weight = torch.empty(w.n, w.k).uniform_(-bound, bound, generator=gen)
    if not w.bias:
        return x, weight
    return x, weight, torch.empty(w.n).uniform_(-bound, bound, generator=gen)


def reference(w: Workload, x: Any, weight: Any, bias: Any = None) -> Any:
    return linear(x, weight, bias, w.relu)


def baselines(w: Workload, x: Any, weight: Any, bias: Any = None) -> dict[str, Callable[[], Any]]:
    """PyTorch's float32 Linear (MKL's sgemm, then the ReLU) and oneDNN's with its weight packed once and the
    ReLU fused (what tune_model's dense_linear runs), where this PyTorch has it."""
    import torch

    out = {"torch (F.linear)": lambda: linear(x, weight, bias, w.relu)}
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        post = ("relu", [None]) if w.relu else ("none", [])
        out["oneDNN linear (packed)"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, post[0],
                                                                                     post[1], "")
    return out


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], x: Any, weight: Any, bias: Any = None
                ) -> tuple[Sequence[Any], Any]:
    """(x, the packed weight, the bias (the packed zeros for a layer without one), Y) with Y allocated (M, N)
    float32, and Y."""
    import torch

    y = torch.empty(x.shape[0], w.n, dtype=torch.float32, device=x.device)
    return [x, packed[0], packed[1] if bias is None else bias, y], y


def traffic(w: Workload, *tensors: Any) -> Traffic:
    """X and W read once, Y written once; 2 M K N float operations (the products of one float32 GEMM)."""
    return Traffic(bytes=float(4 * (w.m * w.k + w.n * w.k + w.m * w.n)), ops=2.0 * w.m * w.n * w.k, unit="GFLOPS")


def tolerance(w: Workload) -> tuple[float, float]:
    """A K-term float32 dot product summed in any order stays within K u of the sum of its |terms| (u = 2^-24);
    the pieces' products add their float32 roundings (six per tile step of 32) and the dropped ones 3 u: judged
    against float64 (REFERENCE_PRECISION) within 2 (K + 64) u of each output's sum of |terms|."""
    return (2 * (w.k + 64) * U, 0.0)
