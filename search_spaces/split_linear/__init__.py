"""A float32 Linear (+ ReLU) at float32 accuracy on AMX tiles: `Y = relu?(X @ W.T + b)`, X and W each split
into three bf16 pieces whose six significant products accumulate in float32 (workload.py says why that is a
float32 result, and how it is judged).

workload.py: fields, semantics, inputs, reference, tolerance; checks.py: what the op accepts (imports torch);
kernel.py: the TVMScript (a task's rows split once into a scratch the tiles load; the weight split once, at
packing); cpu.py: knobs, space, packing. CPU only (DEVICE_KINDS). torch_op.py: `torch.ops.autotune.split_linear`
(with Linear's backward); graph.py: the rule that offers it for a model's float32 Linears on CPUs with
AMX-BF16, kept by tune_model only where the model runs faster with it than on oneDNN (`dense_linear`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..template import GraphRule, by_device
from . import cpu
from .workload import Workload, baselines, inputs, kernel_args, reference, tolerance, traffic

if TYPE_CHECKING:
    from ..template import TorchBinding

__all__ = ["DEVICE_KINDS", "DOC", "EXAMPLE_SHAPE", "NAME", "REFERENCE_PRECISION", "TEST_SHAPE", "WEIGHTS",
           "Workload", "baselines", "check_inputs", "graph_rules", "inputs", "kernel_args", "lower", "pack",
           "reference", "space", "tolerance", "torch_binding", "traffic"]

NAME = "split_linear"
DOC = ("float32 Linear (+ ReLU) at float32 accuracy: X and W split into three bf16 pieces each, their six "
       "significant products summed in float32 on AMX tiles (CPU only; float32 FMAs without AMX-BF16)")
EXAMPLE_SHAPE = "m=2048,k=512,n=256,relu=1"
TEST_SHAPE = "m=37,k=45,n=40,relu=1"  # M, K and N not whole tiles: the padding and the guards are exercised
WEIGHTS = (1,)  # the weight (reference argument 1) is split and packed once, outside the timed call
DEVICE_KINDS = ("cpu",)
# a dot product's terms cancel (ReLU'd activations times weights of both signs): judged against float64 within
# a bound scaled by each output's sum of |terms|, as PyTorch's own float32 GEMM is
REFERENCE_PRECISION = "float64"

space, lower = by_device(cpu, None)  # CPU only: a GPU target is refused, saying so
pack = cpu.pack


def check_inputs(w: Workload, *tensors: Any) -> None:
    """Raise a clear error for tensors the kernel cannot take (checks.py, imports torch)."""
    from .checks import check_inputs as check

    check(w, *tensors)


def torch_binding() -> "TorchBinding":
    """`torch.ops.autotune.split_linear` (torch_op.py, imports torch)."""
    from .torch_op import BINDING

    return BINDING


def graph_rules() -> tuple[GraphRule, ...]:
    """The rule that offers it for a model's float32 Linears (graph.py, imports torch)."""
    from .graph import RULES

    return RULES
