"""Embedding-bag: ragged gathers of table rows, pooled per bag (torch.nn.functional.embedding_bag).

Batch, number of indices and table rows are symbolic, so one compiled kernel serves any batch; the embedding
dimension, mode, index dtype and options are compiled in. workload.py: fields, inputs, reference, the kernels'
data checks; checks.py: what the op accepts (imports torch); cpu.py and cuda.py: each device's knobs, TVMScript
and schedule (kernel.py: the signature they share).
"""

from __future__ import annotations

from typing import Any

from ..template import GraphRule, TorchBinding, by_device
from . import cpu, cuda
from .workload import Workload, baselines, inputs, kernel_args, pack, reference, tolerance, traffic
from .workload import after_call  # noqa: F401  (optional member: raises what the kernel flagged)
from .workload import timed_inputs  # noqa: F401  (optional member: timed calls gather new rows)

NAME = "embedding_bag"
DOC = "torch.nn.functional.embedding_bag: ragged bags (offsets), sum/mean/max, per-sample weights, padding_idx"
EXAMPLE_SHAPE = "rows=1000000,dim=64,batch=2048,pooling=20-80,dist=zipf:1.05"
TEST_SHAPE = "rows=50,dim=24,batch=13,pooling=0-7"
WEIGHTS: tuple[int, ...] = ()  # nothing to pack: rows are gathered from the table as it is

__all__ = ["DOC", "EXAMPLE_SHAPE", "NAME", "TEST_SHAPE", "WEIGHTS", "Workload", "baselines", "check_inputs",
           "graph_rules", "inputs", "kernel_args", "lower", "pack", "reference", "space", "tolerance",
           "torch_binding", "traffic"]


space, lower = by_device(cpu, cuda)  # the target picks cpu.py or cuda.py


def check_inputs(w: Workload, *tensors: Any) -> None:
    """Raise a clear error for tensors the kernel cannot take (checks.py, imports torch)."""
    from .checks import check_inputs as check

    check(w, *tensors)


def gathered_rows(w: Workload, weight: Any, indices: Any, offsets: Any, per_sample_weights: Any = None) -> Any:
    """The table rows one call gathers, in order (template.py: the roof `autotune bench` prints gathers the
    same ones)."""
    import numpy as np

    rows = (indices[:int(offsets[-1])] if w.include_last_offset else indices).numpy().astype(np.int64)
    return rows if w.padding_idx is None else rows[rows != w.padding_idx]


def torch_binding() -> TorchBinding:
    from .torch_op import BINDING

    return BINDING


def graph_rules() -> tuple[GraphRule, ...]:
    """How the operator is found in a captured PyTorch graph (graph.py, imports torch; tune_model reads it)."""
    from .graph import RULES

    return RULES
