"""qmatmul_cross's workload and semantics: qmatmul's (qmatmul/workload.py), then DCNv2's cross-layer tail.

    y = x0 * qmatmul(a, weight, a_scale, w_scale, bias) + x            (float32, M x N)

x0 and x are (M, N): the cross network's input and the layer's input, float32, or bfloat16 with `state=
"bfloat16"` (y too: the tail computed in float32 from the widened state, rounded once to bfloat16 as stored;
half the traffic of a layer bound by it, qmatmul/graph.py). In DCNv2's low-rank cross layer
`x_{l+1} = x0 * (W (V x_l) + b) + x_l` (Wang et al., 2021; TorchRec's LowRankCrossNet, MLPerf's DLRMv2) this is
the W product with everything after it. No ReLU (the cross layer has none), no weight-only mode (the cross
layer's W reads the V layer's int8 output). No tvm import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..qmatmul import workload as _qmatmul
from .._timed_inputs import fresh_activations
from ..template import Traffic, WorkloadError

__all__ = ["Workload", "baselines", "cross", "inputs", "kernel_args", "reference", "timed_inputs", "tolerance",
           "traffic"]


STATES = ("float32", "bfloat16")  # the dtype of x0, x and y


@dataclass(frozen=True)
class Workload(_qmatmul.Workload):
    """qmatmul's fields, and the cross state's dtype; int8 or uint8 activations, no ReLU."""

    state: str = "float32"

    KEY_DEFAULTS = {**_qmatmul.Workload.KEY_DEFAULTS, "state": "float32"}  # older records: float32 state

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.state not in STATES:
            raise WorkloadError(f"state must be one of {', '.join(STATES)}, got {self.state!r}")
        if self.mode == "weight_only":
            raise WorkloadError("qmatmul_cross takes int8 or uint8 activations (mode=int8 or uint8), not weight_only")
        if self.relu:
            raise WorkloadError("qmatmul_cross has no ReLU: the cross layer's tail follows the product directly")


def cross(y: Any, x0: Any, x: Any) -> Any:
    """The cross layer's tail on the float32 product y (bias included): x0 * y + x, in float32 from 16-bit state
    (widened), rounded to the state's dtype."""
    import torch

    return (x0.float() * y + x.float()).to(x.dtype) if x.dtype != torch.float32 else x0 * y + x


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """qmatmul's (A, W, a_scale, w_scale[, bias]), then x0 and x: (M, N) of the state's dtype."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    dtype = getattr(torch, w.state)
    return (*_qmatmul.inputs(w, seed), torch.randn(w.m, w.n, generator=g).to(dtype),
            torch.randn(w.m, w.n, generator=g).to(dtype))


def timed_inputs(w: Workload, seed: int, tensors: tuple[Any, ...], cache_bytes: int) -> tuple[tuple[Any, ...], ...]:
    """The input sets timed calls cycle through: new x0 and x for each (the other operands shared). A model's
    cross layer reads the activations earlier kernels wrote, from memory where they outgrow the cache (DLRMv2's:
    28 MB each); timed on one pair kept in cache, the configs whose epilogues stream them badly rank first."""
    return fresh_activations(tensors, (len(tensors) - 2, len(tensors) - 1), traffic(w, *tensors).bytes,
                             cache_bytes, seed)


def reference(w: Workload, *tensors: Any) -> Any:
    *operands, x0, x = tensors
    return cross(_qmatmul.reference(w, *operands), x0, x)


def baselines(w: Workload, *tensors: Any) -> dict[str, Callable[[], Any]]:
    """What eager PyTorch runs: qmatmul's PyTorch paths (not fbgemm's, whose output is requantized to one scale),
    then the tail as its own elementwise ops."""
    *operands, x0, x = tensors
    out: dict[str, Callable[[], Any]] = {"torch eager": lambda: reference(w, *tensors)}
    for name, f in _qmatmul.baselines(w, *operands).items():
        if "fbgemm" not in name:
            out[f"{name} + cross tail"] = lambda f=f: cross(f(), x0, x)
    return out


def kernel_args(w: Workload, dims: tuple[int, int, int], packed: Sequence[Any], *tensors: Any
                ) -> tuple[list[Any], Any]:
    """(A, *packed, a_scale, w_scale, bias?, X0, X, Y) for the padded `dims` (x0, x zero-padded like A where the
    shape is not whole tiles; Y of the state's dtype), and the (M, N) output the caller gets."""
    *operands, x0, x = tensors
    mp, _, np_ = dims
    pad = (0, np_ - w.n, 0, mp - x0.shape[0])
    tails = [_qmatmul.zero_padded(t, pad) for t in (x0, x)]
    args = _qmatmul.padded_inputs(w, dims, packed, *operands)
    y = x.new_empty(mp, np_)  # padded rows and channels are computed and dropped: the caller gets an (M, N) view
    return [*args, *tails, y], y if (mp, np_) == (x.shape[0], w.n) else y[: x.shape[0], : w.n]


def traffic(w: Workload, *tensors: Any) -> Traffic:
    """qmatmul's (a float32 y written), with x0 and x read; 16-bit state: each of the three half as large."""
    t = _qmatmul.traffic(w, *tensors)
    state = 3 * w.m * w.n * (2 if w.state == "bfloat16" else 4)
    return Traffic(bytes=t.bytes - w.m * w.n * 4 + state, ops=t.ops + 2.0 * w.m * w.n, unit=t.unit)


def tolerance(w: Workload) -> tuple[float, float]:
    """qmatmul's; with bfloat16 state, one bfloat16 ulp of y (up to 2^-7 relative: the kernel's float32 sum may
    sit on the other side of a rounding boundary from the reference's)."""
    rtol, atol = _qmatmul.tolerance(w)
    return (max(rtol, 2.0 ** -7), atol) if w.state == "bfloat16" else (rtol, atol)
