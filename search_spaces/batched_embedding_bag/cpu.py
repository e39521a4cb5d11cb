"""The table-batched embedding bag on the CPU (llvm): (table, bag) pairs spread over cores (in tasks, or in runs
of equal work), SIMD over the dimension, software prefetch of rows ahead. Its knobs and their constraints are
embedding_bag's CPU ones (`embedding_bag.cpu`), less the dimension tiles and loop order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..embedding_bag.cpu import (ACCUMULATOR as _ACCUMULATOR, BAGS_PER_TASK, LINES_NEED_PREFETCH, PREFETCH,
                                 PREFETCH_LINES, TASKS_NEED_PARALLEL, THREADING, UNROLL, VECTOR, check_llvm,
                                 in_scratch, parallel_tasks, prefetch_lines, simd, vectorize_innermost,
                                 vectors)
from ..space import Choice, Config, Constraint, Space
from .kernel import compute
from .workload import Workload

__all__ = ["ACCUMULATOR", "BAGS_PER_TASK", "EVEN_RUNS", "ORDER", "PREFETCH", "PREFETCH_LINES", "THREADING", "UNROLL",
           "VECTOR", "lower", "schedule", "space"]

# The same knob with local first: this kernel's untuned choice has always pooled into a local buffer (its output
# rows are strided by tables x dim, and "output" exists for mode=sum only), so defaults and records keep meaning.
ACCUMULATOR = replace(_ACCUMULATOR, options=("local", "output"))


ORDER = Choice("order", ("tables", "bags", "even"), doc=(
    "The order of the (table, bag) pairs the parallel tasks split: table by table (a task's rows from one table, "
    "its hot rows cached together), sample by sample (every task holds each table's share of the work: "
    "balanced where tables' bag sizes differ by far, as MLPerf DLRMv2's 1 to 100 ids; output rows written in "
    "order), or 'even': table by table in runs of equal work (indices and bags, found at run time from the "
    "offsets), so the cores are balanced whatever the bags hold and the rows come in the indices' own order, the "
    "one the prefetch reads ahead in (sample by sample, the row `prefetch` indices ahead belongs to a later bag "
    "of the same table). The cores take contiguous runs of tasks, so table by table one core may get the heavy "
    "tables. Offered where the workload's tables pool differently (table_pooling): elsewhere the tasks balance "
    "alike."))
# runs of equal work in the 'even' order: with the cores' contiguous shares of them, the threads' work differs by
# at most one run (1/64 of the call), and each run costs two bisections of the offsets (~40 loads)
EVEN_RUNS = 64
EVEN_RUNS_OWN_TASKS = Constraint(
    "the 'even' order makes its own parallel runs: no bags_per_task, parallel, pooled in a local scratch",
    lambda c: c[ORDER] != "even" or (c[BAGS_PER_TASK] == BAGS_PER_TASK.options[0] and c[THREADING] == "parallel"
                                     and c[ACCUMULATOR] == "local"))


def space(w: Workload, target: Any) -> Space:
    """The CPU space: threading, SIMD width, unroll, prefetch, accumulator (sum only: in the output), the order
    of the pairs (where tables pool differently)."""
    check_llvm("batched_embedding_bag", target)
    accumulators = ACCUMULATOR.options if w.mode == "sum" else ("local",)
    return Space(
        [THREADING, BAGS_PER_TASK, vectors(w.dim), UNROLL, PREFETCH, prefetch_lines(w.rows_format),
         ACCUMULATOR.only(accumulators), ORDER if w.table_pooling else ORDER.only(("tables",))],
        [LINES_NEED_PREFETCH, TASKS_NEED_PARALLEL, EVEN_RUNS_OWN_TASKS],
    )


def schedule(sch: Any, w: Workload, cfg: Config) -> None:
    """Parallel over fused (table, bag) pairs in the config's ORDER; SIMD over the accumulator's setting and its
    write-back (the rows' loops, unrolled and in SIMD vectors, are compute's)."""
    vec = cfg[VECTOR]
    if cfg[ORDER] != "even":  # (the 'even' order's parallel runs are the kernel's own: compute's `runs`)
        tables, bags = sch.get_loops(sch.get_sblock("bag"))
        if cfg[ORDER] == "bags":
            sch.reorder(bags, tables)
            tables, bags = bags, tables
        parallel_tasks(sch, sch.fuse(tables, bags), cfg)
    simd(sch, sch.get_sblock("acc_init"), vec)
    if cfg[ACCUMULATOR] == "local":
        vectorize_innermost(sch, sch.get_sblock("finalize"), vec)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The scheduled IRModule of one CPU config: what `tvm.compile` builds."""
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, cfg[PREFETCH], cfg[PREFETCH_LINES], direct=cfg[ACCUMULATOR] == "output",
                           branch=in_scratch(w, cfg),  # (embedding_bag.cpu.checks: the faster check for the loop)
                           unroll=cfg[UNROLL], vector=cfg[VECTOR],
                           runs=EVEN_RUNS if cfg[ORDER] == "even" else 0))
    schedule(sch, w, cfg)
    return sch.mod
