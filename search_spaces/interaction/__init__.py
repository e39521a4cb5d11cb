"""DLRM dot interaction: pairwise dot products of one sample's features, fused with the dense concatenation.

The template of `search_spaces.Template`: workload.py holds the semantics (DLRM's `interact_features`, see
there), inputs and reference; checks.py what the op accepts (imports torch); cpu.py the fused CPU kernel (one
pass per sample, features staged in L1, only the kept dot products computed, each output element written once)
and its knobs; cuda.py the thread-level CUDA kernel (shared-memory staging, register tiles, warp shuffles) and
its knobs.
"""

from __future__ import annotations

from typing import Any

from ..template import GraphRule, TorchBinding, by_device
from . import cpu, cuda
from .workload import Workload, baselines, inputs, kernel_args, pack, reference, tolerance, traffic

__all__ = ["DOC", "EXAMPLE_SHAPE", "NAME", "REFERENCE_PRECISION", "TEST_SHAPE", "WEIGHTS", "Workload", "baselines",
           "check_inputs", "graph_rules", "inputs", "kernel_args", "lower", "pack", "reference", "space", "tolerance",
           "torch_binding", "traffic"]

NAME = "interaction"
DOC = ("DLRM interact_features: x and T embeddings -> cat([x, tril(Z = T T^T)]), fused (dot), "
       "or cat([x] + ly) (cat)")
EXAMPLE_SHAPE = "batch=2048,tables=26,dim=64"
TEST_SHAPE = "batch=5,tables=3,dim=12"  # D not a multiple of the vector widths: the zero padding is exercised
WEIGHTS: tuple[int, ...] = ()  # no model weights: both inputs are activations
# judged against the reference in float64, the bound scaled by each output's sum |x_i y_i| (runtime.judge): dot
# products of large terms cancel, and fp32 rounding, PyTorch's as much as a kernel's, scales with the terms
REFERENCE_PRECISION = "float64"


space, lower = by_device(cpu, cuda)  # the target picks cpu.py or cuda.py


def check_inputs(w: Workload, *tensors: Any) -> None:
    """Raise a clear error for tensors the kernel cannot take (checks.py, imports torch)."""
    from .checks import check_inputs as check

    check(w, *tensors)


def torch_binding() -> TorchBinding:
    """`torch.ops.autotune.interaction` (imports torch)."""
    from .torch_op import BINDING

    return BINDING


def graph_rules() -> tuple[GraphRule, ...]:
    """How the operator is found in a captured PyTorch graph (graph.py, imports torch; tune_model reads it)."""
    from .graph import RULES

    return RULES
