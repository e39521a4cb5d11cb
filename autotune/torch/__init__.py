"""Tuned kernels inside PyTorch: custom operators, drop-in modules and `optimize(model, package)`.

    import autotune.torch as at
    pkg = at.load("kernels/")          # a package written by `autotune export`
    y = torch.ops.autotune.embedding_bag(weight, indices, offsets, mode="sum")
    print(at.optimize(model, pkg))     # nn.EmbeddingBag -> at.EmbeddingBag, nn.Linear -> at.QuantLinear, ...

`torch.ops.autotune.<op>` exists, once this module is imported, for every operator template that declares a
torch binding; it runs the loaded kernel that fits a call's shapes and PyTorch's implementation otherwise (one
warning per workload). The drop-in modules (at.EmbeddingBag, at.DotInteraction, at.QuantLinear, ...) are the
operators' own exports. $AUTOTUNE_KERNELS (package directories separated by os.pathsep) is loaded on the first
call if set. Kernels need TVM's runtime only (tvm_ffi and the package's libtvm_runtime.so), not the compiler.
"""

from __future__ import annotations

from . import threads  # noqa: F401  TVM thread-pool defaults, set before any kernel starts the pool
from . import dense, ops  # noqa: F401  (dense: torch.ops.autotune.dense_linear)
from .ops import BINDINGS, IndexOutOfRange, InvalidDtype, InvalidInput, NoTunedKernelWarning
from .optimize import OptimizeReport, optimize
from .registry import REGISTRY, LoadedKernel, Package, StalePackage, load, load_default
from .accuracy import Tolerance
from .speed import SpeedCheck
from .tune_model import TuneModelReport, tune_model

EXPORTS: dict[str, object] = {name: value for b in BINDINGS.values() for name, value in b.exports}
globals().update(EXPORTS)  # at.EmbeddingBag, at.quantize_rows, ...: declared by the operators' bindings

__all__ = sorted(["IndexOutOfRange", "InvalidDtype", "InvalidInput", "LoadedKernel", "NoTunedKernelWarning",
                  "OptimizeReport", "Package", "REGISTRY", "SpeedCheck", "StalePackage", "Tolerance",
                  "TuneModelReport", "load", "load_default", "ops", "optimize", "tune_model", "unload_all",
                  *EXPORTS])


def unload_all() -> None:
    """Forget every loaded package (the operators then run PyTorch's implementation, and warn about it afresh);
    mostly for tests."""
    REGISTRY.clear()
    ops._WARNED.clear()
