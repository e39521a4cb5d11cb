"""DLRM dot interaction: pairwise dot products of one sample's features, fused with the dense concatenation.

The template of `search_spaces.Template`: workload.py holds the semantics (DLRM's `interact_features`, see
there), inputs, reference and checks; cpu.py the fused CPU kernel (one pass per sample, features staged in
L1, only the kept dot products computed, each output element written once) and its knobs; cuda.py the
thread-level CUDA kernel (shared-memory staging, register tiles, warp shuffles) and its knobs.
"""

from __future__ import annotations

from typing import Any

from ..space import Config, Space
from ..template import TorchBinding, is_gpu
from . import cpu, cuda
from .workload import (Workload, baselines, check_inputs, inputs, kernel_args, pack, reference, tolerance,
                       traffic)

__all__ = ["DOC", "EXAMPLE_SHAPE", "NAME", "TEST_SHAPE", "WEIGHTS", "Workload", "baselines", "check_inputs", "inputs",
           "kernel_args", "lower", "pack", "reference", "space", "tolerance", "torch_binding", "traffic"]

NAME = "interaction"
DOC = ("DLRM interact_features: x and T embeddings -> cat([x, tril(Z = T T^T)]), fused (dot), "
       "or cat([x] + ly) (cat)")
EXAMPLE_SHAPE = "batch=2048,tables=26,dim=64"
TEST_SHAPE = "batch=5,tables=3,dim=12"  # D not a multiple of the vector widths: the zero padding is exercised
WEIGHTS: tuple[int, ...] = ()  # no model weights: both inputs are activations


def space(w: Workload, target: Any) -> Space:
    """The knob space of this workload on a CPU ("llvm") or CUDA target."""
    return (cuda if is_gpu(target) else cpu).space(w, target)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The IRModule of one config for this target: what `tvm.compile` builds."""
    return (cuda if is_gpu(target) else cpu).lower(w, cfg, target)


def torch_binding() -> TorchBinding:
    """`torch.ops.autotune.interaction` (imports torch)."""
    from .torch_op import BINDING

    return BINDING
