"""qmatmul whose epilogue is DCNv2's cross layer: `y = x0 * (qmatmul(a, ...) + bias) + x`, in one kernel.

A DCNv2 cross layer (`x_{l+1} = x0 * (W (V x_l) + b) + x_l`; MLPerf's DLRMv2 has three, 3456 wide) ends in
elementwise work as large as its output: run eagerly after an int8 W product, the bias add, the product with x0
and the residual add each pass a (batch x 3456) float32 tensor through memory, as long together as both int8
products. Here the W product's epilogue reads x0 and x as it writes the output: the product never exists in
memory. qmatmul's chain rule (qmatmul/graph.py, the tail in search_spaces/_cross_tail.py) puts it at the end of a
chain the tail follows.

workload.py: fields and semantics; cpu.py: qmatmul's CPU kernel with this epilogue; torch_op.py:
`torch.ops.autotune.qmatmul_cross`. CPU only (DEVICE_KINDS): GPUs run the tail eagerly after qmatmul.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..qmatmul import cpu as _qmatmul_cpu, scalar_args, sized_args
from ..space import Config
from ..template import GraphRule, by_device
from . import cpu
from .workload import Workload, baselines, inputs, kernel_args as _kernel_args, reference, tolerance, traffic
from .workload import timed_inputs  # noqa: F401  (optional member: timed calls read new x0 and x)

if TYPE_CHECKING:
    from ..template import TorchBinding

__all__ = ["DEVICE_KINDS", "DOC", "EXAMPLE_SHAPE", "NAME", "TEST_SHAPE", "WEIGHTS", "Workload", "baselines",
           "check_inputs", "graph_rules", "inputs", "kernel_args", "lower", "pack", "reference", "scalar_args", "space",
           "tolerance", "torch_binding", "traffic"]

NAME = "qmatmul_cross"
DOC = "int8 matmul whose epilogue is DCNv2's cross layer: x0 * (A @ W.T * scales + bias) + x (CPU only)"
EXAMPLE_SHAPE = "m=2048,k=512,n=3456"
TEST_SHAPE = "m=13,k=40,n=24"  # M, K and N not whole tiles: padding is exercised
WEIGHTS = (1,)  # the weight is packed once, as qmatmul's
DEVICE_KINDS = ("cpu",)

space, lower = by_device(cpu, None)


def pack(w: Workload, cfg: Config, weight: Any) -> tuple[Any, ...]:
    return _qmatmul_cpu.pack(w, cfg, weight)


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], *tensors: Any) -> tuple[list[Any], Any]:
    return sized_args(_kernel_args, w, cfg, packed, *tensors)


def check_inputs(w: Workload, *tensors: Any) -> None:
    """qmatmul's checks of the operands and this workload's M, K and N (qmatmul/checks.py, imports torch), then
    the op's of x0 and x (float32, (M, N), the operands' device, contiguous)."""
    import torch

    from ..qmatmul.checks import check_inputs as check
    from .torch_op import check as check_op, op_call

    if len(tensors) < 2 or not all(isinstance(t, torch.Tensor) for t in tensors[-2:]):
        raise TypeError("qmatmul_cross: expected qmatmul's tensors, then x0 and x (tensors)")
    check(w, *tensors[:-2])
    args, kwargs = op_call(w, tensors)
    check_op(*args, **kwargs)


def torch_binding() -> "TorchBinding":
    """`torch.ops.autotune.qmatmul_cross` (torch_op.py, imports torch)."""
    from .torch_op import BINDING

    return BINDING


def graph_rules() -> tuple[GraphRule, ...]:
    """None of its own: qmatmul's chain rule (qmatmul/graph.py) ends a chain with it where a cross tail follows."""
    return ()
