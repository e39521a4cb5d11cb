"""qmatmul whose epilogue quantizes each output row for the next int8 layer, in one kernel:
`(q, scale) = quantize_rows(qmatmul(a, ...), out_qmax)`.

In an int8 MLP each layer's output is the next layer's input, quantized per row. As two ops, the float32
output goes to memory and comes back for the quantize kernel, which then took several times longer in the
Criteo-shaped DLRM than alone (benchmarks/WHOLE_MODEL.md). Here a CPU task owns whole rows
and quantizes the rows it just computed, still in its cache; the float32 rows never leave the task. An MLP's
head layer with too few inputs for int8 activations (DLRM's 13 dense features) runs weight-only, float32
inputs x int8 weights, and quantizes its output the same way.

workload.py: fields, semantics (its input checks are qmatmul's: qmatmul/checks.py); cpu.py / cuda.py: qmatmul's
kernels with the quantizing epilogue (`out_qmax` of qmatmul's compute and schedules).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..qmatmul import pack as _pack, scalar_args, sized_args
from ..space import Config
from ..template import GraphRule, TorchBinding, by_device
from . import cpu, cuda
from .workload import Workload, baselines, inputs, kernel_args as _kernel_args, reference, tolerance, traffic

__all__ = ["DOC", "EXAMPLE_SHAPE", "NAME", "TEST_SHAPE", "WEIGHTS", "Workload", "baselines", "check_inputs",
           "graph_rules", "inputs", "kernel_args", "lower", "pack", "reference", "scalar_args", "space", "tolerance",
           "torch_binding", "traffic"]

NAME = "qmatmul_requant"
DOC = "qmatmul whose epilogue quantizes each output row to int8 + one scale, for the next int8 layer"
EXAMPLE_SHAPE = "m=2048,k=512,n=256,relu=1,a_bits=7,out_qmax=63"
TEST_SHAPE = "m=10,k=40,n=24,relu=1,out_qmax=63"  # M, K and N not whole tiles: padding is exercised
WEIGHTS = (1,)  # the weight is packed once, as qmatmul's

space, lower = by_device(cpu, cuda)


def pack(w: Workload, cfg: Config, weight: Any) -> tuple[Any, ...]:
    return _pack(w, cfg, weight)


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], *tensors: Any) -> tuple[list[Any], Any]:
    return sized_args(_kernel_args, w, cfg, packed, *tensors)


def check_inputs(w: Workload, *tensors: Any) -> None:
    """qmatmul's (qmatmul/checks.py, imports torch): the same operands."""
    from ..qmatmul.checks import check_inputs as check

    check(w, *tensors)


def torch_binding() -> TorchBinding:
    """`torch.ops.autotune.qmatmul_requant` (torch_op.py, imports torch)."""
    from .torch_op import BINDING

    return BINDING


def graph_rules() -> tuple[GraphRule, ...]:
    """None of its own: qmatmul's chain rule (qmatmul/graph.py) puts it between the int8 layers it finds."""
    return ()
