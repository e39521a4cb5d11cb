"""qmatmul_cross whose output rows are also quantized for the next int8 layer, in one kernel:
`y = x0 * (qmatmul(a, ...) + bias) + x`, `(q, scale) = quantize_rows(y, out_qmax)`.

In DLRMv2's cross network each layer's output is the next layer's residual (float32) and its V product's int8
input. As two ops, y goes to memory and comes back whole for the quantize kernel (28 MB a layer at batch 2048).
Here a CPU task owns whole rows and quantizes the rows it just computed, still in its cache; after the last
layer, whose output only the next MLP reads quantized, y is not written at all (`out_float`). qmatmul's chain
rule (qmatmul/graph.py) links the cross layers' chains through it.

workload.py: fields and semantics; cpu.py: qmatmul_cross's kernel with qmatmul_requant's quantizing tasks;
torch_op.py: `torch.ops.autotune.qmatmul_cross_requant`. CPU only (DEVICE_KINDS), as qmatmul_cross.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..qmatmul import cpu as _qmatmul_cpu
from ..qmatmul_cross import check_with, pack  # noqa: F401  (pack: qmatmul's, the same weight)
from ..space import Config
from ..template import GraphRule, by_device
from . import cpu
from .workload import Workload, baselines, inputs, kernel_args as _kernel_args, reference, tolerance, traffic
from .workload import timed_inputs  # noqa: F401  (optional member: timed calls read new x0 and x)

if TYPE_CHECKING:
    from ..template import TorchBinding

__all__ = ["DEVICE_KINDS", "DOC", "EXAMPLE_SHAPE", "NAME", "TEST_SHAPE", "WEIGHTS", "Workload", "baselines",
           "check_inputs", "graph_rules", "inputs", "kernel_args", "lower", "pack", "reference", "space",
           "tolerance", "torch_binding", "traffic"]

NAME = "qmatmul_cross_requant"
DOC = ("qmatmul_cross whose output rows are also quantized to int8 + one scale for the next int8 layer "
       "(CPU only)")
EXAMPLE_SHAPE = "m=2048,k=512,n=3456"
TEST_SHAPE = "m=13,k=40,n=24,out_qmax=63"  # M, K and N not whole tiles: padding is exercised
WEIGHTS = (1,)  # the weight is packed once, as qmatmul's
DEVICE_KINDS = ("cpu",)

space, lower = by_device(cpu, None)


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], *tensors: Any) -> tuple[list[Any], Any]:
    return _kernel_args(w, _qmatmul_cpu.padded(w, cfg), packed, *tensors)


def check_inputs(w: Workload, *tensors: Any) -> None:
    """qmatmul_cross's checks (imports torch), errors naming this op, and out_qmax's."""
    from . import torch_op

    check_with(torch_op, w, tensors)


def torch_binding() -> "TorchBinding":
    """`torch.ops.autotune.qmatmul_cross_requant` (torch_op.py, imports torch)."""
    from .torch_op import BINDING

    return BINDING


def graph_rules() -> tuple[GraphRule, ...]:
    """None of its own: qmatmul's chain rule (qmatmul/graph.py) links cross layers' chains through it."""
    return ()
