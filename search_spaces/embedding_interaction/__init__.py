"""DLRM's embedding bags and dot interaction fused into one CPU kernel: each sample's rows are pooled straight
from the tables into the interaction's staged features, so the (B, T, D) pooled rows the table-batched bag
would write, and the interaction read back, are never in memory.

workload.py: fields, inputs, reference (the batched embedding bag, then the dot interaction), checks; kernel.py:
the TVMScript; cpu.py: knobs, space and schedule. CPU only (DEVICE_KINDS): on a GPU the two operators run
apart (`batched_embedding_bag` and `interaction` have CUDA kernels), and a GPU target is refused. torch_op.py:
`torch.ops.autotune.embedding_interaction` (its backward recomputes the pooled rows); graph.py: the rule that
claims a model's bags and interaction together, kept by tune_model only where the whole model runs faster
with it than with the two operators apart (`GraphRule.fuses`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..template import GraphRule, by_device
from . import cpu
from .workload import (Workload, baselines, check_inputs, inputs, kernel_args, pack, reference, tolerance,
                       traffic)
from .workload import after_call  # noqa: F401  (optional member: raises what the kernel flagged)
from .workload import timed_inputs  # noqa: F401  (optional member: timed calls gather new rows)
from .workload import magnitude_args  # noqa: F401  (optional member: int8 rows' magnitude as floats)

if TYPE_CHECKING:
    from ..template import TorchBinding

__all__ = ["DEVICE_KINDS", "DOC", "EXAMPLE_SHAPE", "NAME", "REFERENCE_PRECISION", "TEST_SHAPE", "WEIGHTS",
           "Workload", "baselines", "check_inputs", "graph_rules", "inputs", "kernel_args", "lower", "pack",
           "reference", "space", "tolerance", "torch_binding", "traffic"]

NAME = "embedding_interaction"
DOC = ("table-batched embedding bags (sum) fused into DLRM's dot interaction: x and T tables' bags -> "
       "cat([x, tril(Z)]), the pooled rows never written (CPU only)")
EXAMPLE_SHAPE = ("rows=1460+583+200000x2+305+24+12517+633+3+93145+5683+200000+3194+27+14992+200000+10+5652+2173"
                 "+4+200000+18+15+200000+105+142572,dim=64,batch=2048,pooling=1,dist=zipf:1.1")
TEST_SHAPE = "rows=50+7+300,dim=12,batch=5,pooling=0-3"  # D not a multiple of 8: the staged features' padding
WEIGHTS: tuple[int, ...] = ()  # nothing to pack: rows are gathered from the tables as they are
DEVICE_KINDS = ("cpu",)
# judged as the interaction is, against float64 with a bound scaled by each output's sum of |terms|: its dot
# products of pooled rows cancel as the interaction's do
REFERENCE_PRECISION = "float64"

space, lower = by_device(cpu, None)  # CPU only: a GPU target is refused, saying so


def torch_binding() -> "TorchBinding":
    """`torch.ops.autotune.embedding_interaction` (torch_op.py, imports torch)."""
    from .torch_op import BINDING

    return BINDING


def graph_rules() -> tuple[GraphRule, ...]:
    """The rule that claims a model's bags and their interaction together (graph.py, imports torch)."""
    from .graph import RULES

    return RULES
