"""Row-wise symmetric int8 quantization of activations: (q = round(x / scale), scale = max|x_row| / qmax).

The template of `search_spaces.Template`: workload.py holds the semantics (exactly PyTorch's, bit for bit: see
there), inputs and reference; checks.py what the op accepts (imports torch); cpu.py the two-pass vector kernel (max
|x|, then the quotient, round half to even, clamp, narrow; quotient.py: the division's bits from two FMAs) and its
knobs, with a smoothed layer's column factors applied in both passes (`smooth`); cuda.py a block of threads per row
(or a warp per row, several rows a block) with a cross-thread max reduction. An int8 MLP layer (qmatmul's
QuantLinear) quantizes its input here instead of in six eager PyTorch ops. The range is the workload's `qmax` (127;
63 gives 7-bit activations, for int8 kernels whose AVX2 `vpmaddubsw` would saturate on full-range ones).
"""

from __future__ import annotations

from typing import Any

from ..template import GraphRule, TorchBinding, by_device
from . import cpu, cuda
from .workload import Workload, baselines, inputs, kernel_args, pack, reference, tolerance, traffic

__all__ = ["DOC", "EXAMPLE_SHAPE", "NAME", "TEST_SHAPE", "WEIGHTS", "Workload", "baselines", "check_inputs",
           "graph_rules", "inputs", "kernel_args", "lower", "pack", "reference", "space", "tolerance",
           "torch_binding", "traffic"]

NAME = "quantize_rows"
DOC = ("row-wise symmetric int8 quantization: q = round(x / scale) in [-qmax, qmax], scale = max|x_row| / qmax "
       "(qmax=127 by default, 63 for 7-bit activations)")
EXAMPLE_SHAPE = "rows=2048,cols=512"
TEST_SHAPE = "rows=9,cols=37"  # cols not a multiple of any vector width: the scalar tail is exercised
WEIGHTS: tuple[int, ...] = ()  # no model weights: the input is an activation


space, lower = by_device(cpu, cuda)  # the target picks cpu.py or cuda.py


def check_inputs(w: Workload, *tensors: Any) -> None:
    """Raise a clear error for tensors the kernel cannot take (checks.py, imports torch)."""
    from .checks import check_inputs as check

    check(w, *tensors)


def torch_binding() -> TorchBinding:
    """`torch.ops.autotune.quantize_rows` (imports torch)."""
    from .torch_op import BINDING

    return BINDING


def graph_rules() -> tuple[GraphRule, ...]:
    """None of its own: qmatmul's graph rule inserts this op in front of each int8 layer it makes."""
    return ()
