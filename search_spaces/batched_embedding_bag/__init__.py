"""Table-batched embedding bag: many tables of different sizes pooled in one kernel launch (FBGEMM's TBE).

DLRM looks up 26 tables per sample. Calling `embedding_bag` per table launches T kernels, each too small to
fill a GPU (or to amortise a CPU parallel region); FBGEMM's `SplitTableBatchedEmbeddingBagsCodegen` instead
takes every table at once, in its layout, which this template follows:

- `weight`: the tables concatenated by rows, `(sum_rows, dim)` float32, one dimension for all tables;
- `table_offsets`: int64, length T+1, the first row of each table in `weight` (`rows` prefix sums);
- `indices`: the indices of all tables concatenated (table-major), each local to its own table;
- `offsets`: length T*B+1, the bag boundaries of the T*B bags (table-major: bag t*B + b is table t, sample b),
  with the end of the last bag included;
- output `(B, T*dim)`: sample b's pooled embeddings of every table side by side, which is what DLRM's
  interaction consumes (`torch.cat(per_table_outputs, dim=1)`).

workload.py: fields, inputs, reference, checks (built on embedding_bag's); kernel.py: the TVMScript; cpu.py
and cuda.py: each device's knobs (embedding_bag's, shared) and schedule.
"""

from __future__ import annotations



from ..template import GraphRule, by_device
from . import cpu, cuda
from .workload import (Workload, baselines, check_inputs, inputs, kernel_args, pack, reference, tolerance,
                       traffic)
from .workload import after_call  # noqa: F401  (optional member: raises what the kernel flagged)
from .workload import timed_inputs  # noqa: F401  (optional member: timed calls gather new rows)

NAME = "batched_embedding_bag"
DOC = ("table-batched embedding_bag (FBGEMM TBE, DLRM's 26 tables): T tables concatenated, one launch, "
       "output (batch, T*dim); sum/mean/max")
EXAMPLE_SHAPE = "rows=1000000x4+100000x8+1000x14,dim=128,batch=2048,pooling=20-80,dist=zipf:1.05"
TEST_SHAPE = "rows=50+7+300,dim=16,batch=9,pooling=0-6"
WEIGHTS: tuple[int, ...] = ()  # nothing to pack: rows are gathered from the concatenated tables as they are

__all__ = ["DOC", "EXAMPLE_SHAPE", "NAME", "TEST_SHAPE", "WEIGHTS", "Workload", "baselines", "check_inputs",
           "graph_rules", "inputs", "kernel_args", "lower", "pack", "reference", "space", "tolerance",
           "torch_binding", "traffic"]


space, lower = by_device(cpu, cuda)  # the target picks cpu.py or cuda.py


def torch_binding() -> "TorchBinding":
    """`torch.ops.autotune.batched_embedding_bag` (torch_op.py, imports torch)."""
    from .torch_op import BINDING

    return BINDING


def graph_rules() -> tuple[GraphRule, ...]:
    """How the operator is found in a captured PyTorch graph (graph.py, imports torch; tune_model reads it)."""
    from .graph import RULES

    return RULES
