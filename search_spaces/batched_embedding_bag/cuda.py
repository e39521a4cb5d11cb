"""The table-batched embedding bag on CUDA: one grid over all T*B bags, threads along the dimension with
16-byte loads, several bags per block; and the CPU twin of its schedule (`lower_emulation`). GPU_VECTOR,
THREADS and GPU_UNROLL are embedding_bag's CUDA knobs (`embedding_bag.cuda`), with this kernel's defaults.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..embedding_bag.cuda import (GPU_UNROLL as _GPU_UNROLL, GPU_VECTOR, THREADS as _THREADS, block_sizes,
                                  check_cuda, gpu_vectors, unroll_vectorize)
from ..space import Choice, Config, Constraint, InvalidConfig, Space
from .kernel import compute
from .workload import Workload

__all__ = ["BAG_ROUNDS", "DIM_ITERS", "GPU_UNROLL", "GPU_VECTOR", "THREADS", "lower", "lower_emulation",
           "schedule", "space"]

# ---- knobs --------------------------------------------------------------------------------------------
DIM_ITERS = Choice("dim_iters", (1, 2, 4), doc=(
    "Vector loads per thread per row: threads along the dimension = dim / (gpu_vector * dim_iters). More "
    "loads per thread give each thread independent loads in flight and free threads for more bags."))
BAG_ROUNDS = Choice("bag_rounds", (1, 2, 4, 8), doc=(
    "Bags each row of threads pools one after another: 1 launches a block per `threads / dim threads` bags "
    "of the tuned batch (the hardware spreads ragged bags over the SMs as blocks finish); more make fewer, "
    "longer-lived blocks that amortise block start-up. Larger batches than tuned still run: the blocks "
    "stride over them."))
# embedding_bag's knobs (same meaning) with this kernel's own options, in its own order: its default config, a
# warp per 512-byte row in blocks of 256 with 4 rows per staged step, stays what it was tuned and tested from.
THREADS = replace(_THREADS, options=(256, 128, 512, 64, 1024))
GPU_UNROLL = replace(_GPU_UNROLL, options=(4, 1, 2, 8))


def space(w: Workload, target: Any) -> Space:
    """The CUDA space: vector width and loads per thread along the dimension, block size, rounds, unroll."""
    check_cuda("batched_embedding_bag", target)
    vectors = gpu_vectors(w.rows_format)
    iters = [i for i in DIM_ITERS.options if any(w.dim % (v * i) == 0 for v in vectors)]
    return Space(
        [GPU_VECTOR.only(vectors), DIM_ITERS.only(iters), block_sizes(THREADS, target), BAG_ROUNDS, GPU_UNROLL],
        [
            Constraint("gpu_vector * dim_iters must divide dim",
                       lambda c: w.dim % (c[GPU_VECTOR] * c[DIM_ITERS]) == 0),
            Constraint("a block must hold at least one bag: threads along dim <= threads per block",
                       lambda c: _dim_threads(w, c) <= c[THREADS]),
        ],
    )


def _blocks_per_table(w: Workload, cfg: Config) -> int:
    """The grid's x extent (y is the table): enough blocks for the tuned batch in `bag_rounds` rounds."""
    bags_per_block = (cfg[THREADS] // _dim_threads(w, cfg)) * cfg[BAG_ROUNDS]
    return -(-w.batch // bags_per_block)


def _dim_threads(w: Workload, cfg: Config) -> int:
    """Threads that share one bag, along the dimension."""
    return w.dim // (cfg[GPU_VECTOR] * cfg[DIM_ITERS])


def schedule(sch: Any, w: Workload, cfg: Config, target: Any, bind_threads: bool = True) -> None:
    """One launch for all T*B bags: blockIdx.y is the table, blockIdx.x x threadIdx.y its bags, threadIdx.x
    the dimension.

    Each thread owns `dim_iters` vectors of `gpu_vector` floats of its bag's rows (interleaved, so that a
    warp's loads of one row are contiguous 16-byte loads), gathers `gpu_unroll` rows per step into registers,
    pools them into register accumulators and stores its lanes of the output row once.
    """
    vec, iters, threads = cfg[GPU_VECTOR], cfg[DIM_ITERS], cfg[THREADS]
    if w.dim % (vec * iters):
        raise InvalidConfig(f"gpu_vector {vec} x dim_iters {iters} does not divide dim {w.dim}")
    tx = _dim_threads(w, cfg)
    if tx > threads or threads > int(target.attrs["max_threads_per_block"]):
        raise InvalidConfig(f"{threads} threads per block cannot hold a bag of {tx} threads "
                            f"(max {int(target.attrs['max_threads_per_block'])})")

    def bind(loop: Any, axis: str) -> None:
        if bind_threads:
            sch.bind(loop, axis)

    t, b = sch.get_loops(sch.get_sblock("bag"))
    # blocks sized for the tuned batch, striding over larger ones: thread extents stay constants (TVM's GPU
    # verification requires it) while the batch stays a runtime value, and no bag divides by the batch
    stride, bx, ty = sch.split(b, [None, _blocks_per_table(w, cfg), threads // tx])
    sch.reorder(t, bx, ty, stride)
    bind(t, "blockIdx.y")
    bind(bx, "blockIdx.x")
    bind(ty, "threadIdx.y")
    for name in ("gather", "acc", "finalize"):
        bind(_split_lanes(sch, sch.get_sblock(name), tx, iters, vec, rows=name != "finalize"), "threadIdx.x")
    steps = sch.get_loops(sch.get_sblock("gather"))[-5]
    sch.decompose_reduction(sch.get_sblock("acc"), steps)  # the init copies the lanes' loop kinds


def _split_lanes(sch: Any, block: Any, tx: int, iters: int, vec: int, rows: bool) -> Any:
    """Split a block's innermost (dimension) loop as iterations x threads x vector lanes, the threads hoisted
    above the step's row loop when the block has one (`rows`); returns the threads' loop."""
    *_, d = sch.get_loops(block)
    di, dx, dv = sch.split(d, [iters, tx, vec])
    if rows:
        u = sch.get_loops(block)[-4]
        sch.reorder(dx, u, di, dv)
        sch.unroll(u)
    else:
        sch.reorder(dx, di, dv)
    unroll_vectorize(sch, di, dv, vec)
    return dx


def lower(w: Workload, cfg: Config, target: Any, emulate: bool = False) -> Any:
    """The scheduled IRModule of one CUDA config: what `tvm.compile` builds (`emulate`: see lower_emulation)."""
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, stage=cfg[GPU_UNROLL]))
    schedule(sch, w, cfg, target, bind_threads=not emulate)
    return sch.mod


def lower_emulation(w: Workload, cfg: Config, target: Any) -> Any:
    """A CPU-buildable twin of a CUDA config's kernel: the exact loop nest (steps, padding, masks, lane splits)
    with the thread loops left serial, to check a GPU config's numerics where there is no GPU."""
    check_cuda("batched_embedding_bag", target)
    return lower(w, cfg, target, emulate=True)
