"""Quantized matmul as DLRM's MLPs use it: `Y = epilogue(A @ W.T)` with W stored (N, K) like nn.Linear.

mode=int8: int8 activations x int8 weights -> exact int32 accumulation, then a fused epilogue:
    Y = relu?(acc * a_scale[m] * w_scale[n] + bias[n])   (per-row activation scale, per-channel weight scale)
mode=weight_only: fp32 activations x int8 weights with per-channel scales:
    Y = relu?((A @ W.T) * w_scale[n] + bias[n])

The weight is packed once into a tiled layout chosen by the config (`pack`), so the inner loop reads the
weight contiguously and, with an int8 intrinsic, in exactly the shape the instruction consumes. The VNNI path
multiplies unsigned activations (A + 128) by signed weights; the exact result is restored by subtracting
128 * sum_k W[n, k], a per-channel term computed at packing time, as FBGEMM does.

On CUDA GPUs one kernel does it all: a thread block per output tile stages K slices of A and W in shared
memory (16-byte vector copies, optionally prefetched through registers), and either warps run int8 tensor-core
steps (ldmatrix + mma.sync m16n8k32, sm_80+) or threads run register tiles of dp4a or plain multiply-adds.
The epilogue is applied to the accumulators in registers and written once. M, K and N are padded to whole
tiles, as on CPUs.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from . import intrinsics
from .space import Choice, Config, Constraint, InvalidConfig, Space
from .template import Traffic, Workload as _Workload, WorkloadError

NAME = "qmatmul"
DOC = "int8 x int8 -> int32 matmul with a fused dequant/bias/ReLU epilogue; or int8 weight-only"
EXAMPLE_SHAPE = "m=2048,k=1024,n=1024"
WEIGHTS = (1,)  # the weight (reference argument 1) is packed once, outside the timed call


@dataclass(frozen=True)
class Workload(_Workload):
    m: int
    k: int
    n: int
    mode: str = "int8"
    bias: bool = True
    relu: bool = False

    def __post_init__(self) -> None:
        for name in ("m", "k", "n"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.mode not in ("int8", "weight_only"):
            raise WorkloadError(f"mode must be int8 or weight_only, got {self.mode!r}")


# ---- knobs ----------------------------------------------------------------------------------------------
INTRINSIC = Choice("intrinsic", ("none", "avx2", "vnni"), doc=(
    "The int8 inner product: LLVM's own vectorisation (widens to int32 and multiplies: slow), AVX2 "
    "sign-extension + pmaddwd (exact, 8 lanes x 2), or AVX-512 VNNI vpdpbusd (16 lanes x 4). Only the "
    "ones the target CPU has are offered."))
LAYOUT = Choice("layout", ("n16k4", "n8k2", "n16k1", "n8k1"), doc=(
    "Packed weight layout (N/nb, K/kb, nb, kb): nb output channels side by side for vector lanes, kb "
    "consecutive k per lane for multi-k dot instructions. Fixed by the intrinsic when one is used."))
M_TILE = Choice("m_tile", (4, 1, 2, 6, 8), doc=(
    "Rows of the register tile: each loaded weight vector is reused for this many rows."))
N_VECTORS = Choice("n_vectors", (2, 1, 4), doc=(
    "Weight vectors (of nb channels) per register tile: accumulators = m_tile x n_vectors registers."))
K_BLOCK = Choice("k_block", (0, 64, 128, 256, 512), doc=(
    "Cache blocking of the reduction (0 = none): a K block of weights stays in L1/L2 across the rows."))
M_BLOCK = Choice("m_block", (64, 16, 32, 128, 256), doc=(
    "Rows per parallel task (rounded down to whole register tiles): the task's activation rows stay in "
    "cache while it sweeps the weight columns."))
N_BLOCK = Choice("n_block", (64, 32, 128, 256), doc=(
    "Columns per parallel task (rounded down to whole register tiles): the task's packed weights stay in "
    "L2 while it sweeps its rows."))
UNROLL = Choice("unroll", (True, False), doc="Unroll the register tile so accumulators stay in registers.")
THREADING = Choice("threading", ("parallel", "serial"), doc="Spread (m_block x n_block) tasks over cores.")

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

_LAYOUT_SHAPE = {"n16k4": (16, 4), "n8k2": (8, 2), "n16k1": (16, 1), "n8k1": (8, 1)}
_INTRIN_LAYOUT = {"vnni": "n16k4", "avx2": "n8k2"}


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def space(w: Workload, target: Any) -> Space:
    """The knob space on this target: CUDA GPUs or CPUs (llvm)."""
    if target.kind.name == "cuda":
        return _gpu_space(w, target)
    if target.kind.name != "llvm":
        raise InvalidConfig(f"qmatmul has no schedule for target kind {target.kind.name!r} yet")
    intrins = ["none"]
    if w.mode == "int8":
        if intrinsics.cpu_has(target, "avx2"):
            intrins.append("avx2")
        if intrinsics.cpu_has(target, "avx512vnni", "avx512bw"):
            intrins.append("vnni")

    def layout_ok(c: Config) -> bool:
        if c[INTRINSIC] in _INTRIN_LAYOUT:
            return c[LAYOUT] == _INTRIN_LAYOUT[c[INTRINSIC]]
        return w.mode == "weight_only" or c[LAYOUT] in ("n16k1", "n8k1", "n16k4", "n8k2")

    layouts = LAYOUT.options if w.mode == "int8" else ("n16k1", "n8k1")
    return Space([INTRINSIC.only(intrins), LAYOUT.only(layouts), M_TILE, N_VECTORS, K_BLOCK, M_BLOCK,
                  N_BLOCK, UNROLL, THREADING],
                 [Constraint("the intrinsic fixes the layout", layout_ok),
                  Constraint("k_block below K only", lambda c: c[K_BLOCK] < _round_up(w.k, 4)),
                  Constraint("weight-only has no int8 intrinsic", lambda c: w.mode == "int8" or c[INTRINSIC] == "none")])


def padded(w: Workload, cfg: Config) -> tuple[int, int, int]:
    """(M, K, N) rounded up to whole tiles: on CPUs register tiles (m_tile rows, n_vectors x nb columns) and
    kb groups, on GPUs block tiles (block_m x block_n, block_k slices).

    Whole tiles keep predicates out of the tensorized blocks (TVM cannot tensorize a guarded block) and out of
    the vectorized copies; the padding holds zeros and its results are dropped."""
    if _on_gpu(cfg):
        return _round_up(w.m, cfg[BLOCK_M]), _round_up(w.k, cfg[BLOCK_K]), _round_up(w.n, cfg[BLOCK_N])
    nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
    return _round_up(w.m, cfg[M_TILE]), _round_up(w.k, kb), _round_up(w.n, nb * cfg[N_VECTORS])


def _block(extent: int, want: int, tile: int) -> int:
    """The largest multiple of `tile` that divides `extent` (itself a multiple of tile) and is <= want."""
    size = max(tile, min(want, extent) // tile * tile)
    while extent % size:
        size -= tile
    return size


# ---- the computation -------------------------------------------------------------------------------------
def compute(w: Workload, cfg: Config) -> Any:
    """TE definition over the packed weight; argument order (A, Wp, [comp], a_scale?, w_scale, [bias], Y).

    The packed weight is (N/nb, K/kb, nb, kb) on CPUs; on GPUs (N, K) for tensor cores, (K/4, N, 4) for CUDA
    cores; zero-padded to whole tiles."""
    import tvm
    from tvm import te

    mp, kp, np_ = padded(w, cfg)
    int8 = w.mode == "int8"
    vnni = not _on_gpu(cfg) and cfg[INTRINSIC] == "vnni"
    A = te.placeholder((mp, kp), "int8" if int8 else "float32", name="A")
    Wp, weight = _packed_weight(cfg, kp, np_)
    w_scale = te.placeholder((np_,), "float32", name="w_scale")
    args = [A, Wp]
    k = te.reduce_axis((0, kp), name="k")
    if int8:
        if vnni:
            comp = te.placeholder((np_,), "int32", name="comp")
            args.append(comp)
            Au = te.compute((mp, kp), lambda i, j: (A[i, j].astype("int32") + 128).astype("uint8"), name="Au")
            src = Au
        else:
            src = A
        acc = te.compute((mp, np_), lambda i, j: te.sum(
            src[i, k].astype("int32") * weight(j, k).astype("int32"), axis=k), name="C")
        a_scale = te.placeholder((mp,), "float32", name="a_scale")
        args += [a_scale, w_scale]

        def value(i: Any, j: Any) -> Any:
            c = acc[i, j] - comp[j] if vnni else acc[i, j]
            return c.astype("float32") * a_scale[i] * w_scale[j]
    else:
        acc = te.compute((mp, np_), lambda i, j: te.sum(
            A[i, k] * weight(j, k).astype("float32"), axis=k), name="C")
        args.append(w_scale)

        def value(i: Any, j: Any) -> Any:
            return acc[i, j] * w_scale[j]
    if w.bias:
        bias = te.placeholder((np_,), "float32", name="bias")
        args.append(bias)
    epilogue: Callable[[Any, Any], Any] = (lambda i, j: value(i, j) + bias[j]) if w.bias else value
    final = (lambda i, j: te.max(epilogue(i, j), tvm.tirx.const(0, "float32"))) if w.relu else epilogue
    Y = te.compute((mp, np_), final, name="Y")
    return tvm.IRModule({"main": te.create_prim_func(args + [Y])})


def _packed_weight(cfg: Config, kp: int, np_: int) -> tuple[Any, Callable[[Any, Any], Any]]:
    """The packed weight's placeholder and W[n, k] expressed on it, in the config's layout (see `pack`)."""
    from tvm import te

    if not _on_gpu(cfg):
        nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
        Wp = te.placeholder((np_ // nb, kp // kb, nb, kb), "int8", name="Wp")
        return Wp, lambda j, k: Wp[j // nb, k // kb, j % nb, k % kb]
    if _k_major(cfg):
        Wp = te.placeholder((kp // 4, np_ * 4), "int8", name="Wp")  # (K/4, N, 4) as rows of N*4 bytes
        return Wp, lambda j, k: Wp[k // 4, j * 4 + k % 4]
    Wp = te.placeholder((np_, kp), "int8", name="Wp")
    return Wp, lambda j, k: Wp[j, k]


def schedule(sch: Any, w: Workload, cfg: Config, target: Any) -> None:
    """Apply `cfg` to the schedule of `compute(w, cfg)` for the target (CUDA or CPU)."""
    if target.kind.name == "cuda":
        _schedule_gpu(sch, w, cfg, target)
        return
    nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
    mp, kp, np_ = padded(w, cfg)
    mt, nv = cfg[M_TILE], cfg[N_VECTORS]
    y, c = sch.get_sblock("Y"), sch.get_sblock("C")
    i, j = sch.get_loops(y)
    mb, nblk = _block(mp, cfg[M_BLOCK], mt), _block(np_, cfg[N_BLOCK], nb * nv)
    io, ii = sch.split(i, [None, mb])
    jo, ji = sch.split(j, [None, nblk])
    sch.reorder(io, jo, ii, ji)
    outer = sch.fuse(io, jo)
    if cfg[THREADING] == "parallel":
        sch.parallel(outer)
    iio, iii = sch.split(ii, [None, mt])
    jio, jii = sch.split(ji, [None, nb * nv])
    sch.reorder(iio, jio, iii, jii)
    sch.compute_at(c, jio, preserve_unit_loops=True)
    if cfg[INTRINSIC] == "vnni":  # A + 128 as u8 once for all column blocks, in its own parallel loop
        au_i, au_j = sch.get_loops(sch.get_sblock("Au"))
        sch.parallel(au_i)
        sch.vectorize(sch.split(au_j, [None, 64])[1] if kp % 64 == 0 else au_j)
    ci, cj, ck = sch.get_loops(c)[-3:]
    cjo, cji = sch.split(cj, [nv, nb])
    cko, cki = sch.split(ck, [None, kb])
    kblk = cfg[K_BLOCK]
    if kblk and kp % kblk == 0 and kblk < kp:
        ckoo, ckoi = sch.split(cko, [None, kblk // kb])
        sch.reorder(ckoo, ckoi, ci, cjo, cji, cki)
        first_k = ckoo
    else:
        sch.reorder(cko, ci, cjo, cji, cki)
        first_k = cko
    if cfg[UNROLL]:
        sch.unroll(ci)
        sch.unroll(cjo)
    intrin = cfg[INTRINSIC]
    if intrin == "none":  # vectorise before decomposing: the update block alone is not a reduction
        sch.reorder(cki, cji)  # lanes innermost: one vector multiply-add chain per k
        sch.unroll(cki)
        sch.vectorize(cji)
    init = sch.decompose_reduction(c, first_k)
    sch.vectorize(sch.get_loops(init)[-1])
    if intrin != "none":
        sch.tensorize(cji, intrinsics.ensure(intrinsics.VNNI_16x4 if intrin == "vnni" else intrinsics.AVX2_8x2))
    sch.vectorize(jii)


# ---- the GPU schedules ------------------------------------------------------------------------------------
_MMA_K = 32  # k of one int8 tensor-core step (mma.sync m16n8k32, issued as 16x16x32 tiles)
_MMA_PAD = 16  # int8 elements each staged row is padded by: ldmatrix rows land in distinct banks


def _on_gpu(cfg: Config) -> bool:
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


def _a_bytes(w: Workload) -> int:
    return 1 if w.mode == "int8" else 4


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


def _gpu_space(w: Workload, target: Any) -> Space:
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
                    lambda c: _prefetch_bytes(w, c) <= 256)])


def _schedule_gpu(sch: Any, w: Workload, cfg: Config, target: Any) -> None:
    """One kernel: a thread block per block_m x block_n output tile, the epilogue fused after the reduction."""
    if cfg[COMPUTE] == "mma":
        _schedule_mma(sch, w, cfg)
    else:
        _schedule_cuda_cores(sch, w, cfg)


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


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, cfg))
    schedule(sch, w, cfg, target)
    return sch.mod


# ---- packing, data, reference ------------------------------------------------------------------------------
def pack(w: Workload, cfg: Config, weight: Any) -> tuple[Any, ...]:
    """The weight (N, K) int8 in the config's layout, zero-padded, on the weight's device: on CPUs
    (N/nb, K/kb, nb, kb), plus for VNNI the compensation 128 * sum_k W[n, k] (int32, per channel); on GPUs
    (N, K) for tensor cores (the column-major B operand it already is) or (K/4, N, 4) for CUDA cores."""
    import torch

    _, kp, np_ = padded(w, cfg)
    wp = torch.zeros(np_, kp, dtype=torch.int8, device=weight.device)
    wp[: w.n, : w.k] = weight
    if _on_gpu(cfg):
        return (wp.view(np_, kp // 4, 4).permute(1, 0, 2).reshape(kp // 4, np_ * 4),) if _k_major(cfg) else (wp,)
    nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
    packed = wp.view(np_ // nb, nb, kp // kb, kb).permute(0, 2, 1, 3).contiguous()
    if cfg[INTRINSIC] == "vnni":
        return packed, (wp.to(torch.int32).sum(1) * 128).to(torch.int32)
    return (packed,)


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(A, W, a_scale, w_scale[, bias]) for int8; (A, W, w_scale[, bias]) for weight-only."""
    import torch

    g = torch.Generator().manual_seed(seed)
    wt = torch.randint(-128, 128, (w.n, w.k), generator=g, dtype=torch.int8)
    w_scale = torch.rand(w.n, generator=g) * 0.01 + 1e-3
    bias = [torch.randn(w.n, generator=g)] if w.bias else []
    if w.mode == "int8":
        a = torch.randint(-128, 128, (w.m, w.k), generator=g, dtype=torch.int8)
        a_scale = torch.rand(w.m, generator=g) * 0.05 + 1e-3
        return (a, wt, a_scale, w_scale, *bias)
    a = torch.randn(w.m, w.k, generator=g)
    return (a, wt, w_scale, *bias)


def accumulate(w: Workload, a: Any, weight: Any) -> Any:
    """A @ W.T exactly: int32 for int8 mode (through float64, exact below 2**53), fp32 otherwise."""
    if w.mode == "int8":
        return (a.double() @ weight.double().t()).to(__import__("torch").int32)
    return a @ weight.float().t()


def reference(w: Workload, *tensors: Any) -> Any:
    import torch

    if w.mode == "int8":
        a, weight, a_scale, w_scale, *rest = tensors
        y = accumulate(w, a, weight).float() * a_scale[:, None] * w_scale[None, :]
    else:
        a, weight, w_scale, *rest = tensors
        y = accumulate(w, a, weight) * w_scale[None, :]
    if w.bias:
        y = y + rest[0]
    return torch.relu(y) if w.relu else y


def baselines(w: Workload, *tensors: Any) -> dict[str, Callable[[], Any]]:
    """PyTorch's fastest paths for the same arithmetic (fbgemm's on CPU only), prepared outside the timed call."""
    import torch

    out: dict[str, Callable[[], Any]] = {}
    if w.mode == "weight_only":
        a, weight, w_scale, *rest = tensors
        wf = weight.float() * w_scale[:, None]
        b = rest[0] if w.bias else None
        out["torch linear (fp32, dequantized weight)"] = lambda: (
            torch.relu(torch.nn.functional.linear(a, wf, b)) if w.relu else torch.nn.functional.linear(a, wf, b))
        return out
    a, weight, a_scale, w_scale, *rest = tensors
    b = rest[0] if w.bias else None
    wt = weight.t().contiguous()

    def int_mm() -> Any:
        y = torch._int_mm(a, wt).float() * a_scale[:, None] * w_scale[None, :]
        y = y + b if b is not None else y
        return torch.relu(y) if w.relu else y

    if w.m > 16 and w.k % 8 == 0 and w.n % 8 == 0:
        out["torch._int_mm + epilogue"] = int_mm
    if a.device.type != "cpu":
        return out
    try:  # fbgemm's quantized linear: u8 activations (one scale), per-channel s8 weights, u8 output
        warnings.filterwarnings("ignore", message=".*quantize_per_.*deprecated", category=UserWarning)
        torch.backends.quantized.engine = "fbgemm"
        qw = torch.quantize_per_channel(weight.float() * w_scale[:, None], w_scale.double(),
                                        torch.zeros(w.n, dtype=torch.long), 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qw, b)
        a_real = a.float() * a_scale[:, None]
        qa = torch.quantize_per_tensor(a_real, float(a_real.abs().max()) / 127, 128, torch.quint8)
        y_max = float(int_mm().abs().max()) if "torch._int_mm + epilogue" in out else 1e3
        out_scale, out_zero = 2 * y_max / 255, 128
        linear = torch.ops.quantized.linear_relu if w.relu else torch.ops.quantized.linear
        out["quantized.linear (fbgemm)"] = lambda: linear(qa, packed, out_scale, out_zero).dequantize()
    except (RuntimeError, AttributeError):
        pass
    return out


def check_inputs(w: Workload, *tensors: Any) -> None:
    import torch

    def need(cond: bool, msg: str, exc: type[Exception] = ValueError) -> None:
        if not cond:
            raise exc(f"qmatmul: {msg}")

    names = (["a", "weight", "a_scale", "w_scale"] if w.mode == "int8" else ["a", "weight", "w_scale"])
    names += ["bias"] if w.bias else []
    need(len(tensors) == len(names), f"expected ({', '.join(names)}), got {len(tensors)} tensors", TypeError)
    t = dict(zip(names, tensors))
    for name, x in t.items():
        need(isinstance(x, torch.Tensor), f"{name} must be a torch.Tensor", TypeError)
        need(x.is_contiguous(), f"{name} must be contiguous")
    devices = sorted({str(x.device) for x in t.values()})
    need(len(devices) == 1, f"all tensors must be on one device, got {', '.join(devices)}")
    a_dtype = torch.int8 if w.mode == "int8" else torch.float32
    need(t["a"].dtype == a_dtype, f"a must be {a_dtype}, got {t['a'].dtype}", TypeError)
    need(tuple(t["a"].shape) == (w.m, w.k), f"a must be ({w.m}, {w.k}), got {tuple(t['a'].shape)}")
    need(t["weight"].dtype == torch.int8, f"weight must be int8, got {t['weight'].dtype}", TypeError)
    need(tuple(t["weight"].shape) == (w.n, w.k), f"weight must be ({w.n}, {w.k}), got {tuple(t['weight'].shape)}")
    for name, size in (("a_scale", w.m), ("w_scale", w.n), ("bias", w.n)):
        if name in t:
            need(t[name].dtype == torch.float32, f"{name} must be float32", TypeError)
            need(tuple(t[name].shape) == (size,), f"{name} must be ({size},), got {tuple(t[name].shape)}")


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], *tensors: Any) -> tuple[list[Any], Any]:
    """Kernel arguments from reference-order tensors with the weight already packed by `pack`."""
    import torch

    def pad(x: Any, widths: tuple[int, ...]) -> Any:  # copies only when the shape is not whole tiles
        return torch.nn.functional.pad(x, widths) if any(widths) else x

    mp, kp, np_ = padded(w, cfg)
    a, _weight, *rest = tensors
    a = pad(a, (0, kp - w.k, 0, mp - w.m))  # whole tiles and kb groups: zero-padded activations
    a_scale = [pad(rest.pop(0), (0, mp - w.m))] if w.mode == "int8" else []
    per_channel = [pad(x, (0, np_ - w.n)) for x in rest]  # w_scale[, bias]
    out = torch.empty(mp, np_, dtype=torch.float32, device=a.device)
    # Padded rows and channels are computed and dropped: the caller gets an (M, N) view of the result.
    return [a, *packed, *a_scale, *per_channel, out], out if (mp, np_) == (w.m, w.n) else out[: w.m, : w.n]


def traffic(w: Workload, *tensors: Any) -> Traffic:
    elem = 1 if w.mode == "int8" else 4
    return Traffic(bytes=float(w.m * w.k * elem + w.n * w.k + w.m * w.n * 4), ops=2.0 * w.m * w.n * w.k,
                   unit="GOPS" if w.mode == "int8" else "GFLOPS")


def tolerance(w: Workload) -> tuple[float, float]:
    return (1e-5, 1e-4) if w.mode == "int8" else (1e-4, 1e-3)
