"""The table-batched embedding bag on the CPU (llvm): (table, bag) pairs spread over cores, SIMD over the
dimension, software prefetch of rows ahead. Its knobs and their constraints are embedding_bag's CPU ones
(`embedding_bag.cpu`), less the dimension tiles and loop order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..embedding_bag.cpu import (ACCUMULATOR as _ACCUMULATOR, BAGS_PER_TASK, LINES_NEED_PREFETCH, PREFETCH,
                                 PREFETCH_LINES, TASKS_NEED_PARALLEL, THREADING, UNROLL, VECTOR, check_llvm,
                                 in_scratch, parallel_tasks, prefetch_lines, simd, vectorize_innermost,
                                 vectors)
from ..space import Config, Space
from .kernel import compute
from .workload import Workload

__all__ = ["ACCUMULATOR", "BAGS_PER_TASK", "PREFETCH", "PREFETCH_LINES", "THREADING", "UNROLL", "VECTOR", "lower",
           "schedule", "space"]

# The same knob with local first: this kernel's untuned choice has always pooled into a local buffer (its output
# rows are strided by tables x dim, and "output" exists for mode=sum only), so defaults and records keep meaning.
ACCUMULATOR = replace(_ACCUMULATOR, options=("local", "output"))


def space(w: Workload, target: Any) -> Space:
    """The CPU space: threading, SIMD width, unroll, prefetch, accumulator (sum only: in the output)."""
    check_llvm("batched_embedding_bag", target)
    accumulators = ACCUMULATOR.options if w.mode == "sum" else ("local",)
    return Space(
        [THREADING, BAGS_PER_TASK, vectors(w.dim), UNROLL, PREFETCH, prefetch_lines(w.rows_format),
         ACCUMULATOR.only(accumulators)],
        [LINES_NEED_PREFETCH, TASKS_NEED_PARALLEL],
    )


def schedule(sch: Any, w: Workload, cfg: Config) -> None:
    """Parallel over fused (table, bag) pairs; SIMD over the accumulator's setting and its write-back (the rows'
    loops, unrolled and in SIMD vectors, are compute's)."""
    vec = cfg[VECTOR]
    parallel_tasks(sch, sch.fuse(*sch.get_loops(sch.get_sblock("bag"))), cfg)
    simd(sch, sch.get_sblock("acc_init"), vec)
    if cfg[ACCUMULATOR] == "local":
        vectorize_innermost(sch, sch.get_sblock("finalize"), vec)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The scheduled IRModule of one CPU config: what `tvm.compile` builds."""
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, cfg[PREFETCH], cfg[PREFETCH_LINES], direct=cfg[ACCUMULATOR] == "output",
                           branch=in_scratch(w, cfg),  # (embedding_bag.cpu.checks: the faster check for the loop)
                           unroll=cfg[UNROLL], vector=cfg[VECTOR]))
    schedule(sch, w, cfg)
    return sch.mod
