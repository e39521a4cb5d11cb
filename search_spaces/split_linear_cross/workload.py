"""split_linear_cross's workload and semantics: split_linear's float32 Linear, then DCNv2's cross-layer tail.

    y = x0 * (x @ W.T + b) + x_l            (float32, M x N)

x0 and x_l are float32 (M, N): the cross network's input and the layer's input (the residual). In DCNv2's
low-rank cross layer `x_{l+1} = x0 * (W (V x_l) + b) + x_l` (TorchRec's LowRankCrossNet, MLPerf's DLRMv2) this is
the W product with everything after it, at float32 accuracy (split_linear/workload.py says how). No ReLU (the cross
layer has none). No tvm import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..space import Config
from ..split_linear import workload as _split
from .._timed_inputs import fresh_activations
from ..template import Traffic, WorkloadError

__all__ = ["Workload", "baselines", "cross", "inputs", "kernel_args", "reference", "timed_inputs", "tolerance",
           "traffic"]


@dataclass(frozen=True)
class Workload(_split.Workload):
    """split_linear's fields, no ReLU."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.relu:
            raise WorkloadError("split_linear_cross has no ReLU: the cross layer's tail follows the product directly")


def cross(y: Any, x0: Any, residual: Any) -> Any:
    """The cross layer's tail on the product y (bias included): x0 * y + x_l."""
    return x0 * y + residual


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """split_linear's (x, weight[, bias]), then x0 and x_l: float32 (M, N)."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    return (*_split.inputs(w, seed), torch.randn(w.m, w.n, generator=g), torch.randn(w.m, w.n, generator=g))


def timed_inputs(w: Workload, seed: int, tensors: tuple[Any, ...], cache_bytes: int) -> tuple[tuple[Any, ...], ...]:
    """The input sets timed calls cycle through: new x0 and x for each (the other operands shared). A model's
    cross layer reads the activations earlier kernels wrote, from memory where they outgrow the cache (DLRMv2's:
    28 MB each); timed on one pair kept in cache, the configs whose epilogues stream them badly rank first."""
    return fresh_activations(tensors, (len(tensors) - 2, len(tensors) - 1), traffic(w, *tensors).bytes,
                             cache_bytes, seed)


def reference(w: Workload, *tensors: Any) -> Any:
    *operands, x0, residual = tensors
    return cross(_split.reference(w, *operands), x0, residual)


def baselines(w: Workload, *tensors: Any) -> dict[str, Callable[[], Any]]:
    """What eager PyTorch runs: split_linear's PyTorch paths (MKL's sgemm, oneDNN's packed Linear), then the tail
    as its own elementwise ops."""
    *operands, x0, residual = tensors
    return {f"{name} + cross tail": (lambda f=f: cross(f(), x0, residual))
            for name, f in _split.baselines(w, *operands).items()}


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], *tensors: Any) -> tuple[Sequence[Any], Any]:
    """(x, the packed weight, the bias (the packed zeros for a layer without one), X0, XR, Y) with Y allocated
    (M, N) float32, and Y."""
    *operands, x0, residual = tensors
    args, y = _split.kernel_args(w, cfg, packed, *operands)
    return [*args[:-1], x0, residual, y], y


def traffic(w: Workload, *tensors: Any) -> Traffic:
    """split_linear's, with x0 and x_l read and the tail's two operations per output."""
    t = _split.traffic(w, *tensors)
    return Traffic(bytes=t.bytes + 2 * w.m * w.n * 4, ops=t.ops + 2.0 * w.m * w.n, unit=t.unit)


def tolerance(w: Workload) -> tuple[float, float]:
    """split_linear's: the tail's two roundings are within its bound of each output's sum of |terms| (under the
    float64 rule the magnitude is |x0| (sum |x w| + |b|) + |x_l|)."""
    return _split.tolerance(w)
