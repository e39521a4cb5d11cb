"""The embedding bag on CUDA: its knobs, space, TVMScript and schedule, and the CPU twin of its schedule.

A bag maps to a group of threads along the dimension (16-byte vector loads, several bags per warp or block);
each thread gathers an unrolled step of rows at once to keep loads in flight, and the group shares index
loads through warp shuffles. `lower_emulation` builds a CUDA config's schedule for the CPU, so that its
numerics can be checked without a GPU. GPU_VECTOR, THREADS and GPU_UNROLL are shared with the table-batched
kernel (`batched_embedding_bag.cuda`).
"""

from __future__ import annotations

import math
from typing import Any

from ..space import Choice, Config, Constraint, InvalidConfig, Space
from .kernel import bag_length, bag_ok, flag_where, in_range, signature
from .rows import RowFormat
from .workload import INDEX_ERROR, OFFSETS_ERROR, Workload

# ---- knobs (GPU_VECTOR, THREADS, GPU_UNROLL: shared with the table-batched kernel) ---------------------
GPU_VECTOR = Choice("gpu_vector", (4, 2, 1), doc=(
    "fp32 lanes one thread loads at once: 4 is a 16-byte float4 load, the widest a thread can issue, so a "
    "32-thread group reads 512 contiguous bytes of a row per instruction. Must divide the dimension."))
DIM_THREADS = Choice("dim_threads", (32, 16, 8, 4, 2, 1, 64, 128, 256), doc=(
    "Threads that pool one bag, side by side along the dimension (each owns dim / (dim_threads * "
    "gpu_vector) vectors of every row, interleaved so a group's loads are contiguous). Fewer threads than a "
    "warp put warp_size / dim_threads bags in each warp and give each thread more independent loads; more "
    "than a warp split wide rows over warps."))
THREADS = Choice("threads", (128, 256, 64, 512, 1024, 32), doc=(
    "Threads per block: threads / (threads along the dimension) bags share a block. Small blocks spread "
    "ragged bags evenly over the SMs; large ones amortise block scheduling. Capped by the target's max "
    "threads per block."))
GPU_UNROLL = Choice("gpu_unroll", (8, 4, 2, 1, 16), doc=(
    "Rows of a bag gathered per unrolled step: a random-row gather is latency-bound, so each thread keeps "
    "this many independent row loads in flight (Little's law: bandwidth x latency bytes must be in flight "
    "per SM); more costs registers."))
INDEX_PREFETCH = Choice("index_prefetch", ("shuffle", "none"), doc=(
    "shuffle: a bag's group of threads reads the next indices (and per-sample weights) together, one per "
    "lane in a single coalesced load, ahead of the gather, then broadcasts each with a warp shuffle (as "
    "FBGEMM's kernels do): one index load instruction per lane per chunk instead of one per row per thread. "
    "none: every thread reads each index itself (a broadcast load from L1)."))
GPU_MAX_ACCUMULATORS = 64  # fp32 partial sums a thread keeps in registers: beyond this they spill
GPU_MAX_IN_FLIGHT = 64  # fp32 values of one unrolled step's loads a thread holds at once, likewise


def check_cuda(name: str, target: Any) -> None:
    if target.kind.name != "cuda":
        raise InvalidConfig(f"{name} has no GPU schedule for target kind {target.kind.name!r}")


def gpu_vectors(fmt: RowFormat) -> list[int]:
    """GPU_VECTOR's widths that divide the dimension and stay aligned in every row (rows.py)."""
    return [v for v in GPU_VECTOR.options if fmt.aligned_vector(v)]


def block_sizes(threads: Choice, target: Any) -> Choice:
    """A THREADS knob's block sizes that the target allows: whole warps, within its max threads per block."""
    max_threads, warp = int(target.attrs["max_threads_per_block"]), int(target.attrs["thread_warp_size"])
    fits = [t for t in threads.options if t <= max_threads and t % warp == 0]
    if not fits:
        raise InvalidConfig(f"no block size of {threads.options} fits {max_threads} threads per block "
                            f"in whole warps of {warp}")
    return threads.only(fits)


def space(w: Workload, target: Any) -> Space:
    """The CUDA space: vector width and threads per bag along the dimension, block size, unroll, indices."""
    check_cuda("embedding_bag", target)
    max_threads = int(target.attrs["max_threads_per_block"])
    vectors = gpu_vectors(w.rows_format)
    lanes = [t for t in DIM_THREADS.options if t <= max_threads and any((w.dim // v) % t == 0 for v in vectors)]
    return Space(
        [GPU_VECTOR.only(vectors), DIM_THREADS.only(lanes), block_sizes(THREADS, target), GPU_UNROLL,
         INDEX_PREFETCH],
        [
            Constraint("dim_threads * gpu_vector must divide dim",
                       lambda c: w.dim % (c[DIM_THREADS] * c[GPU_VECTOR]) == 0),
            Constraint(f"a thread accumulates at most {GPU_MAX_ACCUMULATORS} floats (registers, no spills)",
                       lambda c: w.dim // c[DIM_THREADS] <= GPU_MAX_ACCUMULATORS),
            Constraint(f"a step's loads hold at most {GPU_MAX_IN_FLIGHT} floats per thread (registers)",
                       lambda c: c[GPU_UNROLL] * (w.dim // c[DIM_THREADS]) <= GPU_MAX_IN_FLIGHT),
            Constraint(f"threads per block <= {max_threads} and a block holds whole bags",
                       lambda c: c[DIM_THREADS] <= c[THREADS] <= max_threads and c[THREADS] % c[DIM_THREADS] == 0),
        ],
    )


# ---- the computation ------------------------------------------------------------------------------------
def compute(w: Workload, vec: int, dim_threads: int, unroll: int, shuffle: int = 0, warp: int = 32,
            emulate: bool = False) -> Any:
    """The ragged embedding bag as TVMScript shaped for CUDA (no LLVM intrinsics; same options as the CPU's).

    A "bag" block instance is one thread of a bag's group of `dim_threads`: it owns the `vec`-wide vectors
    `k * dim_threads + t` of every row (interleaved, so the group's loads of a row are contiguous) and pools
    them in registers. The bag's rows are walked in steps of `unroll` rows (the schedule unrolls a step): the
    step's row indices, then its loads (unconditional: past the bag's end they read row 0), then the masked
    adds. With `shuffle` lanes (0: off), each chunk of max(unroll, shuffle) indices (and per-sample weights)
    is first read by the group together, one per lane, and each is broadcast from its lane by a warp shuffle
    restricted to the group's lanes. `emulate` swaps the shuffle for the read it broadcasts (CPU twin).

    Bounds are checked per bag and per row (kernel.py): a bag outside the indices pools nothing, an index out of
    the table loads row 0 in its place and adds nothing; both set the error flag.
    """
    from tvm.script import tirx as T

    D, idt, mode = w.dim, w.index_dtype, w.mode
    fmt = w.rows_format
    WD = fmt.width
    G, U = dim_threads, unroll
    P = max(U, shuffle)  # rows per chunk: whole unrolled steps and, with shuffles, whole sets of lanes
    K = D // (G * vec)
    if K * G * vec != D or (shuffle and (P % shuffle or shuffle > warp or shuffle > G)) or P % U:
        raise InvalidConfig(f"dim {D}: vector {vec} x {G} threads, unroll {U}, shuffle {shuffle} do not fit")
    i64 = "int64"
    weighted = w.per_sample_weights
    has_pad = w.padding_idx is not None
    pad = w.padding_idx if has_pad else -1
    count_pads = has_pad and mode in ("mean", "max")
    ilo = w.include_last_offset
    identity = -math.inf if mode == "max" else 0.0
    shuffled = shuffle > 0
    per_lane = P // shuffle if shuffled else 1
    flag_if = flag_where()

    def end_of(Off: Any, vb: Any, NB: Any, NNZ: Any) -> Any:
        if ilo:
            return T.Cast(i64, Off[vb + 1])
        return T.if_then_else(vb + 1 < NB, T.Cast(i64, Off[T.min(vb + 1, NB - 1)]), NNZ)

    def group_mask(vb: Any) -> Any:
        # The group's lanes in its warp: a block holds whole warps and bags run consecutively through
        # threadIdx.y, so a bag's group sits at position vb % (warp / G) of its warp.
        if G >= warp:
            return T.uint32(0xFFFFFFFF)
        return T.shift_left(T.uint32((1 << G) - 1), T.Cast("uint32", T.truncmod(vb, T.int64(warp // G)) * G))

    def read(src: Any, start: Any, n: Any, pos: Any, zero: Any) -> Any:
        # src[start + pos] for a position inside the bag; past its end, `zero` (rows: row 0, never added)
        return T.if_then_else(pos < n, src[start + pos], zero)

    def at(vc: Any, jo: Any, ji: Any) -> Any:
        return vc * P + jo * U + ji  # the position in the bag of row ji of step jo of chunk vc

    def lane_pos(vc: Any, i: Any, lane: Any) -> Any:
        # where in the bag lane `lane` reads its i-th value of chunk vc: consecutive lanes, consecutive indices
        return vc * P + i * shuffle + lane

    def broadcast(vb: Any, lanes: Any, src: Any, start: Any, n: Any, vc: Any, vj: Any, zero: Any) -> Any:
        # the chunk's vj-th value, held by lane vj % shuffle as its (vj // shuffle)-th; emulated, the read that
        # lane made (the same expression, so a CPU run checks the index algebra of the shuffled schedule)
        if emulate:
            return read(src, start, n, lane_pos(vc, vj // shuffle, vj % shuffle), zero)
        return T.tvm_warp_shuffle(group_mask(vb), lanes[vj // shuffle], vj % shuffle, shuffle, warp)

    def valid(pos: Any, n: Any, row: Any) -> Any:
        # inside the bag and the table (a row out of it is -1: see "row"); padded rows count as absent
        inside = T.And(pos < n, row >= T.int64(0))
        return T.And(inside, row != pad) if has_pad else inside

    def combine(acc: Any, value: Any) -> Any:
        return T.max(acc, value) if mode == "max" else acc + value

    def finish(acc: Any, count: Any) -> Any:
        if mode == "mean":
            return acc / T.max(count, T.float32(1))
        if mode == "max":
            return T.if_then_else(count == T.float32(0), T.float32(0), acc)
        return acc

    @T.macro
    def body(W, S, I, Off, PSW, O, Flag, NB, NNZ):
        for b, t in T.grid(NB, G):
            with T.sblock("bag"):
                vb, vt = T.axis.remap("SS", [b, t])
                if weighted:
                    T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:WD], PSW[0:NNZ])
                else:
                    T.reads(Off[vb:vb + 2], I[0:NNZ], W[0:W.shape[0], 0:WD])
                T.writes(O[vb, 0:D])
                acc = T.sblock_alloc_buffer((K, vec), "float32", scope="local")
                row = T.sblock_alloc_buffer((U,), i64, scope="local")
                val = T.sblock_alloc_buffer((U, K, vec), "float32", scope="local")
                # registers of some options only (an allocated buffer must be used)
                if weighted:
                    scale = T.sblock_alloc_buffer((U,), "float32", scope="local")
                if count_pads:
                    cnt = T.sblock_alloc_buffer((1,), "float32", scope="local")
                if shuffled:
                    lane_idx = T.sblock_alloc_buffer((per_lane,), idt, scope="local")
                if shuffled and weighted:
                    lane_psw = T.sblock_alloc_buffer((per_lane,), "float32", scope="local")
                start = T.Cast(i64, Off[vb])
                end = end_of(Off, vb, NB, NNZ)
                # checked in the kernel (kernel.py): a bag outside the indices, or any bag of an empty table (no
                # row to read in place of a bad index), pools nothing, and the flag says so
                flag_if(Flag, T.Or(not bag_ok(start, end, NNZ), T.And(vb == 0, start != T.int64(0))), OFFSETS_ERROR)
                flag_if(Flag, T.And(W.shape[0] == 0, bag_length(start, end, NNZ) > 0), INDEX_ERROR)
                n = T.Select(W.shape[0] > 0, bag_length(start, end, NNZ), T.int64(0))
                if count_pads:
                    with T.sblock("count"):
                        cnt[0] = T.Cast("float32", n)
                for c in range(T.floordiv(n + T.int64(P - 1), T.int64(P))):
                    if shuffled:
                        with T.sblock("indices"):
                            vc = T.axis.opaque(T.floordiv(n + T.int64(P - 1), T.int64(P)), c)
                            for i in T.unroll(per_lane):  # one coalesced load per lane and value
                                lane_idx[i] = read(I, start, n, lane_pos(vc, i, vt % shuffle), T.Cast(idt, 0))
                                if weighted:
                                    lane_psw[i] = read(PSW, start, n, lane_pos(vc, i, vt % shuffle), T.float32(0))
                    for jo in range(P // U):
                        if c * P + jo * U < n:  # a step starts inside the bag; its rows past the end are masked
                            # a step in three phases (row indices, U independent row loads, then the adds), so
                            # the compiler issues all U loads before it waits on the first
                            for ji in range(U):
                                with T.sblock("row"):
                                    vc = T.axis.opaque(T.floordiv(n + T.int64(P - 1), T.int64(P)), c)
                                    vjo = T.axis.opaque(P // U, jo)
                                    vji = T.axis.opaque(U, ji)
                                    if shuffled:
                                        row[vji] = T.Cast(i64, broadcast(vb, lane_idx, I, start, n, vc, vjo * U + vji,
                                                                         T.Cast(idt, 0)))
                                        if weighted:
                                            scale[vji] = broadcast(vb, lane_psw, PSW, start, n, vc, vjo * U + vji,
                                                                   T.float32(0))
                                    else:
                                        row[vji] = T.Cast(i64, read(I, start, n, at(vc, vjo, vji), T.Cast(idt, 0)))
                                        if weighted:
                                            scale[vji] = read(PSW, start, n, at(vc, vjo, vji), T.float32(0))
                                    # a row out of the table is flagged and becomes -1: row 0 is loaded in its
                                    # place and nothing is added (rows past the bag's end read index 0: in it)
                                    if not in_range(row[vji], W.shape[0]):
                                        Flag[0] = T.bitwise_or(Flag[0], T.int32(INDEX_ERROR))
                                    row[vji] = T.Select(in_range(row[vji], W.shape[0]), row[vji], T.int64(-1))
                                    if count_pads:
                                        cnt[0] = cnt[0] - T.Select(T.And(at(vc, vjo, vji) < n, row[vji] == pad),
                                                                   T.float32(1), T.float32(0))
                            for ji, k, v in T.grid(U, K, vec):
                                with T.sblock("gather"):
                                    # unconditional: rows past the bag's end, or out of the table, read row 0 and
                                    # are not added
                                    vji, vk, vv = T.axis.remap("SSS", [ji, k, v])
                                    val[vji, vk, vv] = fmt.load(W, S, T.max(row[vji], T.int64(0)), (vk * G + vt) * vec + vv)
                            for ji, k, v in T.grid(U, K, vec):
                                with T.sblock("acc"):
                                    vc = T.axis.reduce(T.floordiv(n + T.int64(P - 1), T.int64(P)), c)
                                    vjo, vji = T.axis.remap("RR", [jo, ji])
                                    vk, vv = T.axis.remap("SS", [k, v])
                                    with T.init():
                                        acc[vk, vv] = T.float32(identity)
                                    # a select, not a branch, so that nothing makes the loads conditional
                                    if weighted:
                                        acc[vk, vv] = T.Select(valid(at(vc, vjo, vji), n, row[vji]),
                                                               acc[vk, vv] + val[vji, vk, vv] * scale[vji], acc[vk, vv])
                                    else:
                                        acc[vk, vv] = T.Select(valid(at(vc, vjo, vji), n, row[vji]),
                                                               combine(acc[vk, vv], val[vji, vk, vv]), acc[vk, vv])
                for k, v in T.grid(K, vec):
                    with T.sblock("finalize"):
                        vk, vv = T.axis.remap("SS", [k, v])
                        if count_pads:
                            O[vb, (vk * G + vt) * vec + vv] = finish(acc[vk, vv], cnt[0])
                        else:
                            O[vb, (vk * G + vt) * vec + vv] = finish(acc[vk, vv], T.Cast("float32", n))

    return signature(w, body)


def schedule(sch: Any, w: Workload, cfg: Config, target: Any, bind: bool = True) -> None:
    """Apply a CUDA config to the schedule of the `compute` that `lower` built for it."""
    lanes, vec, threads = cfg[DIM_THREADS], cfg[GPU_VECTOR], cfg[THREADS]
    if w.dim % (lanes * vec) or threads % lanes or threads > int(target.attrs["max_threads_per_block"]):
        raise InvalidConfig(f"{lanes} threads x vector {vec} along dim {w.dim} in blocks of {threads} threads")
    _map_bags(sch, w, threads // lanes, bind)
    _unroll_steps(sch, vec)


def _map_bags(sch: Any, w: Workload, bags_per_block: int, bind: bool) -> None:
    """Bags to (blockIdx.x, threadIdx.y), a bag's threads along the dimension to threadIdx.x.

    The grid is a constant, sized for the tuned batch (`ceil(batch / bags per block)` blocks), and each block
    walks its bags in a loop that a larger batch lengthens: the batch stays symbolic (one kernel, one launch,
    any batch) while TVM's GPU verification, which needs constant launch extents, can still check the kernel.
    Unbound (`bind=False`), the thread loops stay serial: the CPU twin of `lower_emulation`.
    """
    b, t = sch.get_loops(sch.get_sblock("bag"))
    bx, _, ty = sch.split(b, [-(-w.batch // bags_per_block), None, bags_per_block])
    if bind:
        sch.bind(bx, "blockIdx.x")
        sch.bind(ty, "threadIdx.y")
        sch.bind(t, "threadIdx.x")


def _unroll_steps(sch: Any, vec: int) -> None:
    """Unroll a step's rows (independent loads in registers); vector loads, init and stores; masked adds."""
    sch.unroll(sch.get_loops(sch.get_sblock("row"))[-1])
    ji, k, v = sch.get_loops(sch.get_sblock("gather"))[-3:]
    sch.unroll(ji)
    unroll_vectorize(sch, k, v, vec)
    acc = sch.get_sblock("acc")
    c, _, ji, k, v = sch.get_loops(acc)[-5:]
    for loop in (ji, k, v):  # not vectorised: TVM's CUDA codegen cannot emit a select of vectors
        sch.unroll(loop)
    init = sch.decompose_reduction(acc, c)
    unroll_vectorize(sch, *sch.get_loops(init)[-2:], vec)
    unroll_vectorize(sch, *sch.get_loops(sch.get_sblock("finalize"))[-2:], vec)


def unroll_vectorize(sch: Any, k: Any, v: Any, vec: int) -> None:
    """A thread's (vectors, lanes) loops: the vectors unrolled (registers), the lanes one vector access."""
    sch.unroll(k)
    if vec > 1:
        sch.vectorize(v)


def _shuffle_width(cfg: Config, warp: int) -> int:
    """Lanes that share index loads through shuffles: the bag's group, or its part in one warp (0: off)."""
    return min(cfg[DIM_THREADS], warp) if cfg[INDEX_PREFETCH] == "shuffle" else 0


def lower(w: Workload, cfg: Config, target: Any, emulate: bool = False) -> Any:
    """The scheduled IRModule of one CUDA config: what `tvm.compile` builds (`emulate`: see lower_emulation)."""
    from tvm.s_tir import Schedule

    warp = int(target.attrs["thread_warp_size"])
    sch = Schedule(compute(w, cfg[GPU_VECTOR], cfg[DIM_THREADS], cfg[GPU_UNROLL], _shuffle_width(cfg, warp),
                           warp, emulate))
    schedule(sch, w, cfg, target, bind=not emulate)
    return sch.mod


def lower_emulation(w: Workload, cfg: Config, target: Any) -> Any:
    """A CPU-buildable twin of a CUDA config's kernel, to check its numerics where there is no GPU.

    Same TVMScript and schedule (chunks, lane reads, masks, unrolled steps, vector accesses, the bag-to-block
    mapping) with the thread loops left serial and each warp shuffle replaced by the read its source lane made.
    Build it for an `llvm` target. What it cannot check is the hardware: shuffle masks, widths, divergence.
    """
    check_cuda("embedding_bag", target)
    return lower(w, cfg, target, emulate=True)
