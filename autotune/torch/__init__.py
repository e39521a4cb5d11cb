"""Tuned kernels inside PyTorch: custom operators, drop-in modules and `optimize(model, package)`.

    import autotune.torch as at
    pkg = at.load("kernels/")          # a package written by `autotune export`
    y = torch.ops.autotune.embedding_bag(weight, indices, offsets, mode="sum")
    print(at.optimize(model, pkg))     # nn.EmbeddingBag -> at.EmbeddingBag, nn.Linear -> at.QuantLinear, ...

`torch.ops.autotune.{embedding_bag,interaction,qmatmul}` exist once this module is imported; they run the
loaded kernel that fits a call's shapes and PyTorch's implementation otherwise (one warning per workload).
$AUTOTUNE_KERNELS (package directories separated by os.pathsep) is loaded on the first call if set.
Kernels need TVM's runtime only (tvm_ffi and the package's libtvm_runtime.so), not the TVM compiler.
"""

from __future__ import annotations

from . import ops
from .modules import DotInteraction, EmbeddingBag, QuantLinear, quantize_rows
from .ops import IndexOutOfRange, InvalidDtype, InvalidInput, NoTunedKernelWarning
from .optimize import OptimizeReport, optimize
from .registry import REGISTRY, LoadedKernel, Package, load, load_default

__all__ = ["DotInteraction", "EmbeddingBag", "IndexOutOfRange", "InvalidDtype", "InvalidInput", "LoadedKernel",
           "NoTunedKernelWarning", "OptimizeReport", "Package", "QuantLinear", "REGISTRY", "load", "load_default",
           "ops", "optimize", "quantize_rows", "unload_all"]


def unload_all() -> None:
    """Forget every loaded package (the operators then run PyTorch's implementation); mostly for tests."""
    REGISTRY.clear()
