"""split_linear whose epilogue is DCNv2's cross layer: `y = x0 * (x @ W.T + b) + x_l` at float32 accuracy, one kernel.

A DCNv2 cross layer (`x_{l+1} = x0 * (W (V x_l) + b) + x_l`; MLPerf's DLRMv2 has three, 3456 wide) ends in
elementwise work as large as its output: run eagerly after the W product, the bias add, the product with x0 and the
residual add each pass a (batch x 3456) float32 tensor through memory. Here the W product's epilogue reads x0 and
x_l as it writes the output. The float32 twin of qmatmul_cross: split_linear's rule (split_linear/graph.py, the tail
in search_spaces/_cross_tail.py) offers it where the tail follows a float32 Linear.

workload.py: fields and semantics; cpu.py: split_linear's CPU kernels with this epilogue; torch_op.py:
`torch.ops.autotune.split_linear_cross`. CPU only (DEVICE_KINDS).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..template import GraphRule, by_device
from . import cpu
from .workload import Workload, baselines, inputs, kernel_args, reference, tolerance, traffic
from .workload import timed_inputs  # noqa: F401  (optional member: timed calls read new x0 and x)

if TYPE_CHECKING:
    from ..template import TorchBinding

__all__ = ["DEVICE_KINDS", "DOC", "EXAMPLE_SHAPE", "NAME", "REFERENCE_PRECISION", "TEST_SHAPE", "WEIGHTS",
           "Workload", "baselines", "check_inputs", "graph_rules", "inputs", "kernel_args", "lower", "pack",
           "reference", "space", "tolerance", "torch_binding", "traffic"]

NAME = "split_linear_cross"
DOC = ("float32 Linear whose epilogue is DCNv2's cross layer, x0 * (x @ W.T + b) + x_l, at float32 accuracy: "
       "split_linear's bf16 pieces on AMX tiles (CPU only)")
EXAMPLE_SHAPE = "m=2048,k=512,n=3456"
TEST_SHAPE = "m=37,k=45,n=40"  # M, K and N not whole tiles: the padding and the guards are exercised
WEIGHTS = (1,)  # the weight is split and packed once, as split_linear's
DEVICE_KINDS = ("cpu",)
REFERENCE_PRECISION = "float64"  # as split_linear's: each output within a bound of its sum of |terms|

space, lower = by_device(cpu, None)  # CPU only: a GPU target is refused, saying so
pack = cpu.pack


def check_inputs(w: Workload, *tensors: Any) -> None:
    """split_linear's checks of x, the weight and the bias for this workload, then the op's of x0 and x_l
    (torch_op.py, imports torch)."""
    from .torch_op import check_inputs as check

    check(w, *tensors)


def torch_binding() -> "TorchBinding":
    """`torch.ops.autotune.split_linear_cross` (torch_op.py, imports torch)."""
    from .torch_op import BINDING

    return BINDING


def graph_rules() -> tuple[GraphRule, ...]:
    """None of its own: split_linear's rule offers it where a cross tail follows a float32 Linear."""
    return ()
