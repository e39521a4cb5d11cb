"""The interaction's workload, inputs, PyTorch reference and baselines, input checks and kernel arguments.

Semantics are facebookresearch/dlrm's `interact_features`: the F = T + 1 features of a sample are the dense
vector `x` (first) and the T sparse embeddings `ly` (in order); `Z = T·Tᵀ` per sample, and the output row is
`cat([x, Z[li, lj]])` where (li, lj) walks the strict lower triangle in row-major order
(`torch.tril_indices(F, F, offset=-1)`), or the triangle with its diagonal when `self_interaction` is on.
`mode=cat` is DLRM's other interaction, `cat([x] + ly, dim=1)`, a plain copy kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..space import Config
from ..template import Traffic, Workload as _Workload, WorkloadError

MODES = ("dot", "cat")
DTYPES = ("float32",)


@dataclass(frozen=True)
class Workload(_Workload):
    """One interaction call: batch, number of embedding tables T (features F = T + 1), dimension D.

    `self_interaction` keeps the diagonal of Z (DLRM's `arch_interaction_itself`); `mode` is "dot" (pairwise
    dot products) or "cat" (plain concatenation). Only float32 is implemented.
    """

    batch: int
    tables: int
    dim: int
    self_interaction: bool = False
    mode: str = "dot"
    dtype: str = "float32"

    SHAPE_ALIASES = {"self": "self_interaction"}

    def __post_init__(self) -> None:
        for name in ("batch", "tables", "dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise WorkloadError(f"{name} must be an integer, got {value!r}")
        if self.batch < 1:
            raise WorkloadError(f"batch must be >= 1, got {self.batch}")
        if self.tables < 1:
            raise WorkloadError(f"tables must be >= 1 (features F = tables + 1 must be >= 2), got {self.tables}")
        if self.dim < 1:
            raise WorkloadError(f"dim must be >= 1, got {self.dim}")
        if self.mode not in MODES:
            raise WorkloadError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.dtype not in DTYPES:
            raise WorkloadError(f"dtype must be one of {DTYPES} (others are not implemented), got {self.dtype!r}")
        if self.self_interaction and self.mode != "dot":
            raise WorkloadError("self_interaction only applies to mode=dot")

    @property
    def features(self) -> int:
        """F: the dense vector plus one embedding per table."""
        return self.tables + 1

    @property
    def pairs(self) -> int:
        """P: dot products kept, the strict lower triangle of Z (with its diagonal under self_interaction)."""
        f = self.features
        return f * (f + 1) // 2 if self.self_interaction else f * (f - 1) // 2

    @property
    def out_dim(self) -> int:
        return self.dim + self.pairs if self.mode == "dot" else self.dim * self.features



def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(x, ly): dense features (B, D) and the T embeddings stacked as (B, T, D), torch float32 on the CPU."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(w.batch, w.dim, generator=gen)
    ly = torch.randn(w.batch, w.tables, w.dim, generator=gen)
    return x, ly


def _as_list(ly: Any) -> list[Any]:
    import torch

    return list(ly.unbind(1)) if isinstance(ly, torch.Tensor) else list(ly)


def dot_interaction(x: Any, ly: Any, self_interaction: bool = False) -> Any:
    """DLRM's interact_features (dot) of x (B, D) and ly, a stacked (B, T, D) tensor or T (B, D) tensors (as DLRM
    passes them). Needs no workload, so it serves any dtype, device or batch: the torch op's PyTorch path."""
    import torch

    t = torch.cat([x.unsqueeze(1), ly], dim=1) if isinstance(ly, torch.Tensor) else torch.stack([x, *ly], dim=1)
    z = torch.bmm(t, t.transpose(1, 2))
    f = t.shape[1]
    li, lj = torch.tril_indices(f, f, offset=0 if self_interaction else -1, device=z.device)
    return torch.cat([x, z[:, li, lj]], dim=1)


def cat_interaction(x: Any, ly: Any) -> Any:
    """DLRM's interact_features (cat): `cat([x] + ly, dim=1)`, for stacked or listed embeddings."""
    import torch

    return torch.cat([x] + _as_list(ly), dim=1)


def reference(w: Workload, x: Any, ly: Any) -> Any:
    """DLRM's interact_features; `ly` is a list of T (B, D) tensors (as DLRM passes it) or a stacked (B, T, D)."""
    return cat_interaction(x, ly) if w.mode == "cat" else dot_interaction(x, ly, w.self_interaction)


def pack(w: Workload, cfg: Config, *weights: Any) -> tuple[Any, ...]:
    """Nothing to pack: both inputs are activations (WEIGHTS is empty)."""
    return weights


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], x: Any, ly: Any) -> tuple[Sequence[Any], Any]:
    """(x, ly stacked (B, T, D), out) and out, on the inputs' device. A list `ly` is stacked here: that is a
    copy of all embeddings (B*T*D floats), which a caller that already holds them stacked avoids by passing
    the (B, T, D) tensor. The CUDA kernels load 16-byte vectors: a view starting mid-vector is copied."""
    import torch

    if not isinstance(ly, torch.Tensor):
        ly = torch.stack(list(ly), dim=1)
    if x.device.type == "cuda":
        x, ly = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (x, ly))
    out = torch.empty(x.shape[0], w.out_dim, dtype=torch.float32, device=x.device)
    return [x, ly, out], out


def baselines(w: Workload, x: Any, ly: Any) -> dict[str, Callable[[], Any]]:
    """PyTorch paths for the same op, prepared outside the timed call: DLRM's own code (one tensor per table,
    the triangle gathered with two index tensors) and a faster variant (stacked embeddings, one flat
    index_select of the triangle)."""
    import torch

    ly_list = [t.contiguous() for t in _as_list(ly)]  # DLRM holds one tensor per embedding table
    stacked = ly if isinstance(ly, torch.Tensor) else torch.stack(ly_list, dim=1)
    paths: dict[str, Callable[[], Any]] = {"torch dlrm (list ly)": lambda: reference(w, x, ly_list)}
    if w.mode == "cat":
        paths["torch cat (stacked ly)"] = lambda: torch.cat([x, stacked.flatten(1)], dim=1)
        return paths
    f = w.features
    li, lj = torch.tril_indices(f, f, offset=0 if w.self_interaction else -1, device=stacked.device)
    flat = li * f + lj

    def bmm_index_select() -> Any:
        t = torch.cat([x.unsqueeze(1), stacked], dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        return torch.cat([x, z.flatten(1).index_select(1, flat)], dim=1)

    paths["torch bmm + index_select (stacked ly)"] = bmm_index_select
    return paths


def traffic(w: Workload, x: Any, ly: Any) -> Traffic:
    """Bytes read and written once; for dot, the useful flops are 2*B*P*D (the kept dot products only)."""
    batch = x.shape[0]
    moved = 4.0 * batch * (w.dim * w.features + w.out_dim)
    if w.mode == "cat":
        return Traffic(bytes=moved, ops=0.0, unit="GB/s")
    return Traffic(bytes=moved, ops=2.0 * batch * w.pairs * w.dim, unit="GFLOPS")


def tolerance(w: Workload) -> tuple[float, float]:
    """fp32 dot products of length D summed in another order than MKL's bmm. Kernels are judged against float64
    (REFERENCE_PRECISION), rtol relative to each output's sum |x_i y_i|: any order of summation stays within
    D * 2^-24 of it, below 1e-4 up to D = 1600. The atol growing with D serves tune_model's check, which
    compares with the model's fp32 output relative to the output itself."""
    if w.mode == "cat":
        return (0.0, 0.0)
    return (1e-4, 1e-5 * max(8, w.dim))
