"""Quantized matmul on CUDA GPUs: one kernel per call, the epilogue fused after the reduction.

A thread block per output tile stages K slices of A and W in shared memory (16-byte vector copies, optionally
prefetched through registers), and either warps run int8 tensor-core steps (ldmatrix + mma.sync m16n8k32,
sm_80+) or threads run register tiles of dp4a or plain multiply-adds. The epilogue is applied to the
accumulators in registers and written once. M, K and N are padded to whole tiles, as on CPUs.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .. import intrinsics
from ..space import Choice, Config, Constraint, InvalidConfig, Space
from . import compute as _compute
from .workload import Workload, a_bytes as _a_bytes, padded_weight, round_up

# GPU (CUDA) knobs. A thread block computes a block_m x block_n output tile, staging block_k slices of the
# activations and weights in shared memory; warps (tensor cores) or threads (CUDA cores) each own a sub-tile.
COMPUTE = Choice("compute", ("mma", "dp4a", "plain"), doc=(
    "How int8 products are summed: tensor cores (ldmatrix + mma.sync m16n8k32 int8, sm_80+), the dp4a "
    "instruction (four int8 products added to an int32 per instruction, CUDA cores), or plain int32 "
    "multiply-adds. Weight-only (fp32 activations) is always plain fp32 FMAs."))
BLOCK_M = Choice("block_m", (128, 64, 256, 32, 16), doc=(
    "Output rows per thread block: each weight byte staged in shared memory is reused for this many rows. "
    "Bigger tiles reuse more but leave fewer blocks to fill the SMs."))
BLOCK_N = Choice("block_n", (128, 64, 256, 32, 16), doc=(
    "Output channels per thread block: each activation byte staged in shared memory is reused this often."))
WARP_M = Choice("warp_m", (64, 32, 16), doc=(
    "Tensor cores: rows of one warp's output tile. Each A fragment a warp loads is reused across its "
    "warp_n/16 B fragments (and vice versa); its accumulators take warp_m*warp_n/32 registers per thread."))
WARP_N = Choice("warp_n", (64, 32, 16), doc="Tensor cores: columns of one warp's output tile (see warp_m).")
THREAD_M = Choice("thread_m", (8, 4, 2, 1), doc=(
    "CUDA cores (dp4a, plain): rows of one thread's register tile; each weight it reads from shared "
    "memory is reused thread_m times."))
THREAD_N = Choice("thread_n", (8, 4, 2, 1), doc=(
    "CUDA cores: columns of one thread's register tile; its output row segment is one vector store."))
BLOCK_K = Choice("block_k", (64, 32, 128, 16), doc=(
    "Reduction slice staged in shared memory per step: longer slices mean fewer barriers per output and "
    "more shared memory per block (fewer resident blocks)."))
VECTOR_BYTES = Choice("vector_bytes", (16, 8, 4), doc=(
    "Bytes per thread per global->shared copy instruction (16 = 128-bit loads): wider copies need fewer "
    "instructions for the same bytes in flight."))
PREFETCH = Choice("prefetch", (True, False), doc=(
    "Issue the global loads of the next block_k slice (into registers) before computing on the current one, "
    "and store them to shared memory after: memory latency overlaps with the math, for a few more registers."))
MAX_UNROLL = Choice("max_unroll", (64, 16, 256, 0), doc=(
    "Loops of up to this many steps are unrolled explicitly (0 = none): fewer branches and address "
    "computations, at the cost of code size and registers."))

_MMA_K = 32  # k of one int8 tensor-core step (mma.sync m16n8k32, issued as 16x16x32 tiles)
_MMA_PAD = 16  # int8 elements each staged row is padded by: ldmatrix rows land in distinct banks


def is_config(cfg: Config) -> bool:
    """Whether `cfg` is a point of the GPU space (its knobs differ from the CPU space's)."""
    return any(name == COMPUTE.name for name, _ in cfg.items)


def _sm(target: Any) -> int:
    """The target's compute capability as a number: sm_80 -> 80 (0 when the target names none)."""
    arch = str(target.attrs["arch"]) if "arch" in target.attrs else ""
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    return int(digits) if digits else 0


def _tiles(knob: Choice, extent: int) -> Choice:
    """The tile options worth trying for an extent: none much larger than the extent (that is all padding)."""
    limit = max(min(knob.options), 1 << max(0, extent - 1).bit_length())
    return knob.only(o for o in knob.options if o <= limit)


def _threads(cfg: Config) -> int:
    """Threads per block: 32 per warp tile on tensor cores, one per register tile on CUDA cores."""
    if cfg[COMPUTE] == "mma":
        return 32 * (cfg[BLOCK_M] // cfg[WARP_M]) * (cfg[BLOCK_N] // cfg[WARP_N])
    return (cfg[BLOCK_M] // cfg[THREAD_M]) * (cfg[BLOCK_N] // cfg[THREAD_N])


def _row_pad(cfg: Config, elem: int) -> int:
    """Elements each staged activation row is padded by: tensor cores read 16-byte rows with ldmatrix, spread
    over the banks by a 16-byte pad; CUDA cores pad by one copy vector (keeps vector stores aligned)."""
    return _MMA_PAD if cfg[COMPUTE] == "mma" else max(1, cfg[VECTOR_BYTES] // elem)


def _k_major(cfg: Config) -> bool:
    """CUDA cores read the weight as (K/4, N, 4): the 32 threads of a warp read 32 different channels of the
    same 4 k in consecutive shared-memory words (no bank conflicts; dp4a takes the 4 bytes at once). Tensor
    cores read it as stored, (N, K), the column-major B operand of mma."""
    return cfg[COMPUTE] != "mma"


def _shared_bytes(w: Workload, cfg: Config) -> int:
    """Shared memory of one block: the staged activation and weight slices, rows padded."""
    bk, ea = cfg[BLOCK_K], _a_bytes(w)
    w_row = bk if _k_major(cfg) else bk + _MMA_PAD
    return cfg[BLOCK_M] * (bk + _row_pad(cfg, ea)) * ea + cfg[BLOCK_N] * w_row


def _copies_even(w: Workload, cfg: Config) -> bool:
    """Every thread moves whole vectors in each global->shared copy: no predicated or partial vectors."""
    threads, vb, bk = _threads(cfg), cfg[VECTOR_BYTES], cfg[BLOCK_K]
    a_vectors, w_vectors = cfg[BLOCK_M] * bk * _a_bytes(w) // vb, cfg[BLOCK_N] * bk // vb
    return bk % vb == 0 and a_vectors % threads == 0 and w_vectors % threads == 0  # rows hold whole vectors


def _prefetch_bytes(w: Workload, cfg: Config) -> int:
    """Bytes of the next slice each thread holds in registers while prefetching."""
    return (cfg[BLOCK_M] * _a_bytes(w) + cfg[BLOCK_N]) * cfg[BLOCK_K] // _threads(cfg) if cfg[PREFETCH] else 0


def space(w: Workload, target: Any) -> Space:
    """The knob space on this CUDA target: compute paths its architecture has, tiles within its limits."""
    if target.kind.name != "cuda":
        raise InvalidConfig(f"qmatmul has no GPU schedule for target kind {target.kind.name!r}")
    if w.mode == "uint8":
        raise InvalidConfig("uint8 activations run on CPUs only (GPUs: int8 or weight-only)")
    max_threads = int(target.attrs["max_threads_per_block"])
    max_shared = int(target.attrs["max_shared_memory_per_block"])
    registers = int(target.attrs["registers_per_block"]) if "registers_per_block" in target.attrs else 65536
    warp = int(target.attrs["thread_warp_size"])
    paths = ["plain"]
    if w.mode == "int8":  # weight-only multiplies fp32 activations: neither int8 instruction applies
        paths += ["dp4a"] if _sm(target) >= 61 else []
        paths += ["mma"] if _sm(target) >= 80 else []
    first = {k.name: k.options[0] for k in (WARP_M, WARP_N, THREAD_M, THREAD_N)}

    def unused_at_first(c: Config) -> bool:  # the other path's tile knobs would only duplicate configs
        unused = (THREAD_M, THREAD_N) if c[COMPUTE] == "mma" else (WARP_M, WARP_N)
        return all(c[k] == first[k.name] for k in unused)

    def tiles_nest(c: Config) -> bool:
        if c[COMPUTE] == "mma":
            return (c[BLOCK_M] % c[WARP_M] == 0 and c[BLOCK_N] % c[WARP_N] == 0 and c[BLOCK_K] % _MMA_K == 0
                    and c[WARP_M] * c[WARP_N] // warp <= 128)
        return c[BLOCK_M] % c[THREAD_M] == 0 and c[BLOCK_N] % c[THREAD_N] == 0 and c[THREAD_M] * c[THREAD_N] <= 64

    return Space(
        [COMPUTE.only(paths), _tiles(BLOCK_M, w.m), _tiles(BLOCK_N, w.n), WARP_M, WARP_N, THREAD_M, THREAD_N,
         _tiles(BLOCK_K, max(w.k, _MMA_K)), VECTOR_BYTES, PREFETCH, MAX_UNROLL],
        [Constraint("only the chosen compute path's tile knobs vary", unused_at_first),
         Constraint("warp/thread tiles divide the block tile; tensor cores take whole k32 steps; at most 128 "
                    "accumulator registers (tensor cores) or 64 (CUDA cores) per thread", tiles_nest),
         Constraint(f"at least one warp and at most {max_threads} threads per block",
                    lambda c: warp <= _threads(c) <= max_threads),
         Constraint(f"the block's accumulators (block_m x block_n registers) take at most half of its {registers} "
                    "registers (beyond, ptxas spills)", lambda c: c[BLOCK_M] * c[BLOCK_N] <= registers // 2),
         Constraint(f"staged slices fit the {max_shared} bytes of shared memory per block",
                    lambda c: _shared_bytes(w, c) <= max_shared),
         Constraint("every thread copies whole vectors", lambda c: _copies_even(w, c)),
         Constraint("prefetching holds at most 256 bytes (64 registers) of the next slice per thread",
                    lambda c: _prefetch_bytes(w, c) <= 256)],
        paths=[COMPUTE.name])  # tensor cores are ~22% of the valid configs; sampled per path, a third


def padded(w: Workload, cfg: Config) -> tuple[int, int, int]:
    """(M, K, N) rounded up to whole block tiles (block_m x block_n, block_k slices).

    Whole tiles keep predicates out of the tensorized blocks (TVM cannot tensorize a guarded block) and out of
    the vectorized copies; the padding holds zeros and its results are dropped."""
    return round_up(w.m, cfg[BLOCK_M]), round_up(w.k, cfg[BLOCK_K]), round_up(w.n, cfg[BLOCK_N])


def pack(w: Workload, cfg: Config, weight: Any) -> tuple[Any, ...]:
    """The weight (N, K) int8, zero-padded, on the weight's device: (N, K) for tensor cores (the column-major B
    operand it already is) or (K/4, N, 4) for CUDA cores."""
    wp = padded_weight(w, padded(w, cfg), weight)
    if not _k_major(cfg):
        return (wp,)
    np_, kp = wp.shape
    return (wp.view(np_, kp // 4, 4).permute(1, 0, 2).reshape(kp // 4, np_ * 4),)


# ---- the computation and its schedules ----------------------------------------------------------------------
def compute(w: Workload, cfg: Config, out_qmax: int = 0) -> Any:
    """The TE definition over the weight packed (N, K) for tensor cores, (K/4, N, 4) for CUDA cores, zero-padded
    to whole tiles (`out_qmax`: with the output quantized per row, `compute.define`)."""
    return _compute.define(w, padded(w, cfg), lambda kp, np_: _packed_weight(cfg, kp, np_), out_qmax=out_qmax)


def _packed_weight(cfg: Config, kp: int, np_: int) -> tuple[Any, Callable[[Any, Any], Any]]:
    """The packed weight's placeholder and W[n, k] expressed on it (see `pack`)."""
    from tvm import te

    if _k_major(cfg):
        Wp = te.placeholder((kp // 4, np_ * 4), "int8", name="Wp")  # (K/4, N, 4) as rows of N*4 bytes
        return Wp, lambda j, k: Wp[k // 4, j * 4 + k % 4]
    Wp = te.placeholder((np_, kp), "int8", name="Wp")
    return Wp, lambda j, k: Wp[j, k]


def schedule(sch: Any, w: Workload, cfg: Config, out_qmax: int = 0) -> None:
    """One kernel: a thread block per block_m x block_n output tile, the epilogue fused after the reduction;
    with `out_qmax`, the row quantization after it (`_quantize_rows`)."""
    if cfg[COMPUTE] == "mma":
        _schedule_mma(sch, w, cfg)
    else:
        _schedule_cuda_cores(sch, w, cfg)
    if out_qmax:
        _quantize_rows(sch)


_ROW_THREADS = 64  # threads per block of the row-quantizing kernels
_MAX_THREADS = 128  # threads reducing one row's max: consecutive threads read consecutive columns


def _quantize_rows(sch: Any) -> None:
    """The row quantization as three more kernels of the module, after the GEMM's (which writes Y to a global
    scratch): a block per row for the row max (its threads take consecutive columns, so the reads coalesce,
    and combine their maxima by warp shuffles), a thread per row for the scale, then a thread per element.
    Not fused into the GEMM's thread blocks (a block holds block_n columns of a row, not the row), so Y makes
    one round trip through memory; what the CUDA path saves is the separate op's launch and its float32
    output. (A thread per row for the max, reading its row alone, cost 3x the GEMM on an H200.)"""
    amax, scale, q = (sch.get_sblock(name) for name in ("amax", "S", "Q"))
    row, col = sch.get_loops(amax)
    sch.bind(row, "blockIdx.x")
    outer, tx = sch.split(col, [None, _MAX_THREADS])
    sch.reorder(tx, outer)
    sch.bind(tx, "threadIdx.x")
    _bind_threads(sch, sch.get_loops(scale)[0])
    _bind_threads(sch, sch.fuse(*sch.get_loops(q)))


def _bind_threads(sch: Any, loop: Any) -> None:
    blocks, threads = sch.split(loop, [None, _ROW_THREADS])
    sch.bind(blocks, "blockIdx.x")
    sch.bind(threads, "threadIdx.x")


def _stage(sch: Any, block: Any, index: int, at: Any, threads: tuple[int, ...], lanes: int, pad: int) -> Any:
    """Cooperative copy of operand `index` of `block` into shared memory at loop `at`: all threads of the
    block, `lanes` consecutive elements each (one vector load), rows padded by `pad` elements (0: none)."""
    staged = sch.cache_read(block, index, "shared")
    sch.compute_at(staged, at)
    ndim = len(sch.get(staged).writes[0].region)
    fused = sch.fuse(*sch.get_loops(staged)[-ndim:])
    *_, vec = parts = sch.split(fused, [None, *threads, lanes])
    for loop, tag in zip(parts[1:-1], ("threadIdx.y", "threadIdx.x")[-len(threads):]):
        sch.bind(loop, tag)
    sch.vectorize(vec)
    if pad:
        sch.storage_align(staged, 0, axis=ndim - 2, factor=2 * pad, offset=pad)
    return staged


def _prefetch(sch: Any, loop: Any, staged: Sequence[Any], cfg: Config) -> None:
    """Software-pipeline the reduction loop: the next slice's global loads (into registers) are issued before
    this slice's compute, and stored to shared memory after it, so memory latency overlaps with the math.
    The loop body is (A load, A store, W load, W store, compute) once each staged copy has its register stage."""
    if not cfg[PREFETCH]:
        return
    for block in staged:
        sch.annotate(block, "tirx.manifest_shared_memory_local_stage", 1)
    sch.annotate(loop, "software_pipeline_stage", [0, 0, 0, 0, 1])
    sch.annotate(loop, "software_pipeline_order", [0, 3, 1, 4, 2])  # loads, compute, stores


def _unroll(sch: Any, loop: Any, cfg: Config) -> None:
    if cfg[MAX_UNROLL]:
        sch.annotate(loop, "pragma_auto_unroll_max_step", cfg[MAX_UNROLL])
        sch.annotate(loop, "pragma_unroll_explicit", 1)


def _schedule_cuda_cores(sch: Any, w: Workload, cfg: Config) -> None:
    """Register tiling on CUDA cores: thread (ty, tx) accumulates a thread_m x thread_n tile of C in
    registers over block_k slices staged in shared memory, then applies the epilogue from registers."""
    bm, bn, bk, tm, tn = cfg[BLOCK_M], cfg[BLOCK_N], cfg[BLOCK_K], cfg[THREAD_M], cfg[THREAD_N]
    dp4a = cfg[COMPUTE] == "dp4a"
    c, y = sch.get_sblock("C"), sch.get_sblock("Y")
    i, j, k = sch.get_loops(c)
    by, ty, ii = sch.split(i, [None, bm // tm, tm])
    bx, tx, ji = sch.split(j, [None, bn // tn, tn])
    step = 4 if dp4a else 1
    ko, ki, kv = sch.split(k, [None, bk // step, step])
    sch.reorder(by, bx, ty, tx, ko, ki, ii, ji, kv)
    blocks = sch.fuse(by, bx)
    sch.bind(blocks, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.set_scope(c, 0, "local")  # C is the accumulator tile: registers
    sch.reverse_compute_at(y, tx)  # epilogue straight from registers
    yj = sch.get_loops(y)[-1]
    if tn > 1:
        sch.vectorize(sch.split(yj, [None, min(tn, 4)])[1])
    threads = (bm // tm, bn // tn)
    elem = _a_bytes(w)
    staged = [_stage(sch, c, 0, ko, threads, cfg[VECTOR_BYTES] // elem, _row_pad(cfg, elem)),
              _stage(sch, c, 1, ko, threads, cfg[VECTOR_BYTES], 0)]
    _prefetch(sch, ko, staged, cfg)
    sch.decompose_reduction(c, ko)
    if dp4a:
        sch.tensorize(kv, intrinsics.ensure(intrinsics.DP4A_S8))
    _unroll(sch, blocks, cfg)


def _schedule_mma(sch: Any, w: Workload, cfg: Config) -> None:
    """Tensor cores: warps accumulate warp_m x warp_n tiles of C in registers from 16x32 int8 fragments
    (ldmatrix from the staged slices, mma.sync m16n8k32), then apply the epilogue to the accumulators where mma
    left them (each lane holds 8 values of each 16x16 tile, at known positions) and write Y from there."""
    c, y = sch.get_sblock("C"), sch.get_sblock("Y")
    outer, blocks, warps, k0, k1 = _mma_tiles(sch, c, cfg)
    threads = ((cfg[BLOCK_M] // cfg[WARP_M]) * (cfg[BLOCK_N] // cfg[WARP_N]), 32)
    staged = [_stage(sch, outer, index, k0, threads, cfg[VECTOR_BYTES], _MMA_PAD) for index in (0, 1)]
    _prefetch(sch, k0, staged, cfg)
    fragments = [sch.cache_read(outer, index, "local") for index in (0, 1)]
    for block in fragments:
        sch.compute_at(block, k1)
    acc = sch.cache_write(outer, 0, "warp")  # the accumulators; `acc` is now the block reading them out
    sch.reverse_compute_at(acc, warps)
    init = sch.decompose_reduction(outer, k0)
    # Fragments stay in registers only if every index into them is a constant: their loops are unrolled. The
    # epilogue's loops are left to nvcc: unrolled in TIR, TVM's warp-memory lowering could no longer simplify
    # the accumulator indices.
    unrolled = _load_fragments(sch, fragments)
    # Accumulators are laid out (lane, fragment row, fragment column, value): TVM's warp-memory lowering then
    # finds each lane's values contiguous and turns them into that lane's registers.
    sch.transform_layout(acc, ("read", 0), _accumulator_layout)
    unrolled += sch.get_loops(c)[-5:-3]  # the warp's fragment rows and columns
    sch.tensorize(sch.get_loops(c)[-3], intrinsics.ensure(intrinsics.MMA_S8))
    zero = sch.get_child_blocks(init)[0]
    unrolled += sch.get_loops(zero)[-4:-2]
    sch.tensorize(sch.get_loops(zero)[-2], intrinsics.mma_fill(cfg[WARP_M] * cfg[WARP_N] // 32))
    sch.reverse_compute_inline(y)  # the epilogue reads the accumulators where mma left them
    _by_lane(sch, *sch.get_loops(acc)[-2:])
    for loop in unrolled:
        sch.unroll(loop)
    _unroll(sch, k0, cfg)


def _mma_tiles(sch: Any, c: Any, cfg: Config) -> tuple[Any, ...]:
    """16x16x32 tensor-core steps tiled into thread blocks (blockIdx.x) and warps (threadIdx.y); returns the
    step block and the block, warp, k-slice and k-step loops."""
    bm, bn, bk, wm, wn = cfg[BLOCK_M], cfg[BLOCK_N], cfg[BLOCK_K], cfg[WARP_M], cfg[WARP_N]
    i, j, k = sch.get_loops(c)
    i, i_tc = sch.split(i, [None, 16])
    j, j_tc = sch.split(j, [None, 16])
    k, k_tc = sch.split(k, [None, _MMA_K])
    sch.reorder(i, j, k, i_tc, j_tc, k_tc)
    outer = sch.blockize(i_tc)  # one step; `c` is now the step's inner block
    i0, i1, i2 = sch.split(i, [None, bm // wm, wm // 16])
    j0, j1, j2 = sch.split(j, [None, bn // wn, wn // 16])
    k0, k1 = sch.split(k, [None, bk // _MMA_K])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    blocks, warps = sch.fuse(i0, j0), sch.fuse(i1, j1)
    sch.bind(blocks, "blockIdx.x")
    sch.bind(warps, "threadIdx.y")
    return outer, blocks, warps, k0, k1


def _load_fragments(sch: Any, fragments: Sequence[Any]) -> list[Any]:
    """Shared -> registers with ldmatrix, in 16x32 tiles (rows m or n, by k); returns the loops over tiles."""
    loops = []
    for block, intrin in zip(fragments, (intrinsics.LDMATRIX_A_S8, intrinsics.LDMATRIX_B_S8)):
        r, q = sch.get_loops(block)[-2:]
        ro, ri = sch.split(r, [None, 16])
        qo, _ = sch.split(q, [None, _MMA_K])
        sch.reorder(ro, qo, ri)
        sch.transform_layout(block, ("write", 0), _operand_layout)
        sch.tensorize(ri, intrinsics.ensure(intrin))
        loops.append(ro)
    return loops


def _operand_layout(r: Any, q: Any) -> tuple[Any, ...]:
    return (r // 16, q // _MMA_K, *intrinsics.ldmatrix_16x32(r % 16, q % _MMA_K))


def _accumulator_layout(i: Any, j: Any) -> tuple[Any, ...]:
    lane, value = intrinsics.accumulator_16x16(i % 16, j % 16)
    return lane, i // 16, j // 16, value


def _by_lane(sch: Any, rows: Any, cols: Any) -> None:
    """Loops over 16x16 accumulator tiles -> each lane visits its own values: element
    (8*ih + il, 8*jh + 2*jm + jl) of a tile is value 4*jh + 2*ih + jl of lane 4*il + jm."""
    ro, ih, il = sch.split(rows, [None, 2, 8])
    qo, jh, jm, jl = sch.split(cols, [None, 2, 4, 2])
    sch.reorder(ro, qo, ih, jh, il, jm, jl)
    sch.bind(sch.fuse(il, jm), "threadIdx.x")


def lower(w: Workload, cfg: Config, target: Any, out_qmax: int = 0) -> Any:
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, cfg, out_qmax))
    schedule(sch, w, cfg, out_qmax)
    return sch.mod
