"""Quantized matmul on CPUs (llvm): a register-tiled loop nest over a weight packed once into tiles.

The weight is packed once into a tiled layout chosen by the config (`pack`), so the inner loop reads the
weight contiguously and, with an int8 intrinsic, in exactly the shape the instruction consumes. The VNNI path
multiplies unsigned activations (A + 128) by signed weights, the AVX2 u8 path 7-bit activations (A + 64); the
exact result is restored by subtracting offset * sum_k W[n, k], a per-channel term computed at packing time,
as FBGEMM does. The AMX path multiplies whole 16-row tiles (int8 x int8 or uint8 x int8 as they are: no offset)
over the whole reduction, a block of accumulator tiles per register tile (`intrinsics.amx_block`).
"""

from __future__ import annotations

from typing import Any, Callable

from .. import intrinsics
from ..space import Choice, Config, Constraint, InvalidConfig, Space
from . import compute as _compute
from .workload import Workload, padded_weight, round_up

# ---- knobs ----------------------------------------------------------------------------------------------
INTRINSIC = Choice("intrinsic", ("none", "avx2", "avx2_u7", "vnni", "amx"), doc=(
    "The int8 inner product: LLVM's own vectorisation (widens to int32 and multiplies: slow), AVX2 "
    "sign-extension + pmaddwd (exact, 8 lanes x 2), AVX2 pmaddubsw + pmaddwd on A + 64 (8 lanes x 4, twice "
    "the products per instruction; exact for 7-bit activations only, so offered for a_bits=7), AVX-512 "
    "VNNI vpdpbusd (16 lanes x 4), or AMX tdpbssd/tdpbusd (16 x 16 lanes x 64: 256 times VNNI's products per "
    "instruction; then m_tile and n_vectors count 16 x 16 tiles). Only the ones the target CPU has are offered."))
LAYOUT = Choice("layout", ("n16k4", "n8k2", "n16k1", "n8k1", "n8k4"), doc=(
    "Packed weight layout (N/nb, K/kb, nb, kb): nb output channels side by side for vector lanes, kb "
    "consecutive k per lane for multi-k dot instructions. Fixed by the intrinsic when one is used."))
M_TILE = Choice("m_tile", (4, 1, 2, 6, 8), doc=(
    "Rows of the register tile: each loaded weight vector is reused for this many rows."))
N_VECTORS = Choice("n_vectors", (2, 1, 4), doc=(
    "Weight vectors (of nb channels) per register tile: accumulators = m_tile x n_vectors registers."))
K_BLOCK = Choice("k_block", (0, 64, 128, 256, 512), doc=(
    "Cache blocking of the reduction (0 = none): a K block of weights stays in L1/L2 across the rows. AMX (K from "
    "2048): the task's register blocks sweep each k block in turn (whole 64-byte tile rows dividing K, the most up to "
    "this), their accumulators kept in C between blocks."))
M_BLOCK = Choice("m_block", (64, 16, 32, 128, 256), doc=(
    "Rows per parallel task (rounded down to whole register tiles): the task's activation rows stay in "
    "cache while it sweeps the weight columns."))
N_BLOCK = Choice("n_block", (64, 32, 128, 256), doc=(
    "Columns per parallel task (rounded down to whole register tiles): the task's packed weights stay in "
    "L2 while it sweeps its rows."))
BLOCK_ORDER = Choice("block_order", ("rows", "columns"), doc=(
    "The order of a task's register tiles: 'rows', each tile row sweeps the task's weight columns, which then "
    "stream past every m_tile rows (from L3 once they outgrow L2: 3.5 MB for DLRMv2's 3456 -> 1024); "
    "'columns', each tile column sweeps the task's rows, so its weight columns (K x the tile's columns) are read "
    "once per task and stay in L2 with the task's rows (m_block x K). AMX tasks in k blocks run their own order."))
UNROLL = Choice("unroll", (True, False), doc="Unroll the register tile so accumulators stay in registers.")
THREADING = Choice("threading", ("parallel", "serial"), doc="Spread (m_block x n_block) tasks over cores.")

# AMX k blocks only from this K: below it a register block's A rows and weight columns over the whole K stay in
# L1/L2 (32 x 1024 bytes each), and k blocks only add C's loads and stores (benchmarks/WHOLE_MODEL.md: AMX k blocks)
AMX_K_BLOCKS_FROM = 2048

_LAYOUT_SHAPE = {"n16k4": (16, 4), "n8k2": (8, 2), "n16k1": (16, 1), "n8k1": (8, 1), "n8k4": (8, 4)}
_INTRIN_LAYOUT = {"vnni": "n16k4", "avx2": "n8k2", "avx2_u7": "n8k4", "amx": "n16k4"}
# u8 x s8 instructions take A + offset: 128 maps int8 onto u8; 64 maps 7-bit activations below 128 (avx2_u7)
_UNSIGNED_OFFSET = {"vnni": 128, "avx2_u7": 64}
_INTRIN_NAME = {"vnni": intrinsics.VNNI_16x4, "avx2": intrinsics.AVX2_8x2, "avx2_u7": intrinsics.AVX2_8x4_U7}


def space(w: Workload, target: Any, whole_rows: bool = False) -> Space:
    """The knob space on this CPU (an llvm target): only the int8 intrinsics the CPU has are offered.
    `whole_rows` (a row-quantizing epilogue needs each row's max): a task owns whole rows, so no N_BLOCK."""
    if target.kind.name != "llvm":
        raise InvalidConfig(f"qmatmul has no CPU schedule for target kind {target.kind.name!r}")
    intrins = ["none"]
    if w.mode == "int8" and intrinsics.cpu_has(target, "avx2"):
        intrins += ["avx2", "avx2_u7"] if w.a_bits == 7 else ["avx2"]
    # uint8 activations: VNNI's u8 x s8 as they are; AVX2's paths sign-extend A or saturate on 8 unsigned bits
    if w.mode in ("int8", "uint8") and intrinsics.cpu_has(target, "avx512vnni", "avx512bw"):
        intrins.append("vnni")
    if w.mode in ("int8", "uint8") and intrinsics.cpu_has(target, "amx-int8", "amx-tile"):
        intrins.append("amx")

    def layout_ok(c: Config) -> bool:
        if c[INTRINSIC] in _INTRIN_LAYOUT:
            return c[LAYOUT] == _INTRIN_LAYOUT[c[INTRINSIC]]
        return w.mode == "weight_only" or c[LAYOUT] in ("n16k1", "n8k1", "n16k4", "n8k2")

    def amx_ok(c: Config) -> bool:  # a block of whole tiles over a whole k block: nothing to unroll
        return c[INTRINSIC] != "amx" or (intrinsics.amx_fits(c[M_TILE], c[N_VECTORS]) and c[UNROLL]
                                         and (c[K_BLOCK] == 0 or round_up(w.k, intrinsics.AMX_K) >= AMX_K_BLOCKS_FROM))

    layouts = LAYOUT.options if w.mode != "weight_only" else ("n16k1", "n8k1")
    blocks = [M_BLOCK] if whole_rows else [M_BLOCK, N_BLOCK]
    return Space([INTRINSIC.only(intrins), LAYOUT.only(layouts), M_TILE, N_VECTORS, K_BLOCK, *blocks, BLOCK_ORDER,
                  UNROLL, THREADING],
                 [Constraint("the intrinsic fixes the layout", layout_ok),
                  Constraint("an AMX block fits the 8 tile registers and spans k (k blocks from K 2048)", amx_ok),
                  Constraint("k_block below K only", lambda c: c[K_BLOCK] < round_up(w.k, 4)),
                  Constraint("AMX tasks in k blocks run their own order ('rows')",
                             lambda c: not (c[INTRINSIC] == "amx" and c[K_BLOCK]) or c[BLOCK_ORDER] == "rows"),
                  Constraint("weight-only has no int8 intrinsic",
                             lambda c: w.mode != "weight_only" or c[INTRINSIC] == "none")],
                 paths=[INTRINSIC.name])  # each intrinsic is its own inner kernel: sampled evenly, whatever its share


def padded(w: Workload, cfg: Config) -> tuple[int, int, int]:
    """(M, K, N) rounded up to whole register tiles (`tile_rows` rows, n_vectors x nb columns) and kb groups
    (AMX: whole 64-byte tile rows of k).

    Whole tiles keep predicates out of the tensorized blocks (TVM cannot tensorize a guarded block); the
    padding holds zeros and its results are dropped."""
    nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
    kb = intrinsics.AMX_K if cfg[INTRINSIC] == "amx" else kb
    return round_up(w.m, tile_rows(cfg)), round_up(w.k, kb), round_up(w.n, nb * cfg[N_VECTORS])


def tile_rows(cfg: Config) -> int:
    """Rows of a register tile: m_tile, or m_tile 16-row tiles with AMX."""
    return cfg[M_TILE] * (intrinsics.AMX_ROWS if cfg[INTRINSIC] == "amx" else 1)


def task_rows(w: Workload, cfg: Config) -> int:
    """Rows per parallel task: m_block rounded down to whole register tiles dividing the tuned M's padded rows.
    A kernel runs any whole number of tasks (its last argument): a call's rows are padded up to one."""
    mp = round_up(w.m, tile_rows(cfg))
    return _block(mp, cfg[M_BLOCK], tile_rows(cfg))


def _block(extent: int, want: int, tile: int) -> int:
    """The largest multiple of `tile` that divides `extent` (itself a multiple of tile) and is <= want."""
    size = max(tile, min(want, extent) // tile * tile)
    while extent % size:
        size -= tile
    return size


def pack(w: Workload, cfg: Config, weight: Any) -> tuple[Any, ...]:
    """The weight (N, K) int8 as (N/nb, K/kb, nb, kb), zero-padded, on the weight's device; for VNNI also the
    compensation 128 * sum_k W[n, k] (int32, per channel). Weight-only: the same integers as float32 (exact),
    converted here once instead of at every use in the inner loop (`_weight_dtype`)."""
    import torch

    wp = padded_weight(w, padded(w, cfg), weight)
    nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
    np_, kp = wp.shape
    packed = wp.view(np_ // nb, nb, kp // kb, kb).permute(0, 2, 1, 3).to(getattr(torch, _weight_dtype(w))).contiguous()
    offset = _offset(w, cfg)
    if offset:
        return packed, (wp.to(torch.int32).sum(1) * offset).to(torch.int32)
    return (packed,)


# ---- the computation and its schedule -----------------------------------------------------------------------
def compute(w: Workload, cfg: Config, out_qmax: int = 0) -> Any:
    """The TE definition over the weight packed (N/nb, K/kb, nb, kb), zero-padded to whole tiles (`out_qmax`:
    with the output quantized per row, `compute.define`), for any whole number of tasks: M is `tasks` x
    `task_rows`, `tasks` the kernel's last argument, so the schedule's splits of M are exact (no guards: AMX
    blocks tensorize) and one kernel serves every batch, padded up to whole tasks (`call_dims`)."""
    from tvm import te

    _, kp, np_ = padded(w, cfg)
    tasks = te.var("tasks")
    return _compute.define(w, (tasks * task_rows(w, cfg), kp, np_), lambda kp, np_: _packed_weight(w, cfg, kp, np_),
                           params=(tasks,),
                           unsigned_offset=_offset(w, cfg), out_qmax=out_qmax, fma_quotient=True)


def _offset(w: Workload, cfg: Config) -> int:
    """What the config's u8 x s8 instruction adds to the activations: none to uint8 ones (already unsigned)."""
    return 0 if w.mode == "uint8" else _UNSIGNED_OFFSET.get(cfg[INTRINSIC], 0)


def _weight_dtype(w: Workload) -> str:
    """The packed weight's dtype: int8 for the integer products; float32 for weight-only, whose float32
    activations multiply it as floats (an int8 weight cost a sign extension and a conversion per vector per use:
    the fp32 packed weight of DLRM's 13-input layer is 27 KB)."""
    return "int8" if w.mode != "weight_only" else "float32"


def _packed_weight(w: Workload, cfg: Config, kp: int, np_: int) -> tuple[Any, Callable[[Any, Any], Any]]:
    """The packed weight's placeholder and W[n, k] expressed on it (see `pack`)."""
    from tvm import te

    nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
    Wp = te.placeholder((np_ // nb, kp // kb, nb, kb), _weight_dtype(w), name="Wp")
    return Wp, lambda j, k: Wp[j // nb, k // kb, j % nb, k % kb]


def schedule(sch: Any, w: Workload, cfg: Config, out_qmax: int = 0) -> None:
    """Apply `cfg` to the schedule of `compute(w, cfg, out_qmax)`: parallel (m_block x n_block) tasks of register
    tiles; with `out_qmax`, tasks of whole rows that quantize the rows they computed (`_quantize_rows`)."""
    nb = _LAYOUT_SHAPE[cfg[LAYOUT]][0]
    mp, kp, np_ = padded(w, cfg)
    mt, nv = tile_rows(cfg), cfg[N_VECTORS]
    y, c = sch.get_sblock("Y"), sch.get_sblock("C")
    i, j = sch.get_loops(y)
    mb = task_rows(w, cfg)
    nblk = np_ if out_qmax else _block(np_, cfg[N_BLOCK], nb * nv)
    io, ii = sch.split(i, [None, mb])
    jo, ji = sch.split(j, [None, nblk])
    sch.reorder(io, jo, ii, ji)
    outer = sch.fuse(io, jo)
    if cfg[THREADING] == "parallel":
        sch.parallel(outer)
    iio, iii = sch.split(ii, [None, mt])
    jio, jii = sch.split(ji, [None, nb * nv])
    if cfg[BLOCK_ORDER] == "columns":
        sch.reorder(jio, iio, iii, jii)
        jio = iio  # the inner of the two tile loops: each register tile's C is computed there
    else:
        sch.reorder(iio, jio, iii, jii)
    if cfg[INTRINSIC] == "amx" and cfg[K_BLOCK]:
        _amx_k_blocks(sch, c, outer, w, cfg, (mb, nblk))
        sch.vectorize(jii)
        if out_qmax:
            _quantize_rows(sch, outer, np_)
        return
    sch.compute_at(c, jio, preserve_unit_loops=True)
    if _offset(w, cfg):  # A + offset as u8 once for all column blocks, in its own parallel loop
        au_i, au_j = sch.get_loops(sch.get_sblock("Au"))
        sch.parallel(au_i)
        sch.vectorize(sch.split(au_j, [None, 64])[1] if kp % 64 == 0 else au_j)
    ci, cj, ck = sch.get_loops(c)[-3:]
    if cfg[INTRINSIC] == "amx":  # the whole register block over the whole k is one intrinsic
        a_dtype = "uint8" if w.mode == "uint8" else "int8"
        sch.tensorize(ci, intrinsics.amx_block(cfg[M_TILE], nv, kp, a_dtype, (mb, nblk)))
    else:
        _vector_tile(sch, c, cfg, (ci, cj, ck), kp)
    sch.vectorize(jii)
    if out_qmax:
        _quantize_rows(sch, outer, np_)


def _amx_k_blocks(sch: Any, c: Any, task: Any, w: Workload, cfg: Config, blocks: tuple[int, int]) -> None:
    """The task's whole C (its m_block x n_block int32) computed before its epilogue, k block by k block: for
    each block of about k_block (the largest whole number of 64-byte tile rows dividing K, up to k_block),
    every register block of the task, row tiles outer, so that the A rows of a register block stay in L1 while
    the columns sweep, and the task's weights of one k block stay in L2 across its rows. Without k blocks
    (k_block 0) a register block reads its A rows and weight columns over the whole K, from L2 or memory once
    K is large: DLRMv2's 3456-wide layers. The accumulators go to C and come back once per k block."""
    _, kp, _ = padded(w, cfg)
    mt, nv = tile_rows(cfg), cfg[N_VECTORS]
    kblk = _block(kp, cfg[K_BLOCK], intrinsics.AMX_K)
    sch.compute_at(c, task, preserve_unit_loops=True)
    ci, cj, ck = sch.get_loops(c)[-3:]
    cio, cii = sch.split(ci, [None, mt])
    cjo, cji = sch.split(cj, [None, 16 * nv])
    cko, cki = sch.split(ck, [None, kblk])
    sch.reorder(cko, cio, cjo, cii, cji, cki)
    init = sch.decompose_reduction(c, cko)
    sch.vectorize(sch.get_loops(init)[-1])
    a_dtype = "uint8" if w.mode == "uint8" else "int8"
    sch.tensorize(cii, intrinsics.amx_block(cfg[M_TILE], nv, kblk, a_dtype, blocks, k_total=kp))


def _vector_tile(sch: Any, c: Any, cfg: Config, loops: tuple[Any, Any, Any], kp: int) -> None:
    """The register tile's reduction C over its loops (rows, columns, k) in SIMD registers: n_vectors vectors of
    nb lanes, k in kb groups (blocked by k_block), with the config's intrinsic or LLVM's vectorisation."""
    ci, cj, ck = loops
    nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
    cjo, cji = sch.split(cj, [cfg[N_VECTORS], nb])
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
        sch.tensorize(cji, intrinsics.ensure(_INTRIN_NAME[intrin]))


def _row_lanes(np_: int) -> int:
    """fp32 lanes of the row max and the quantizing pass: 32 where the padded row allows (two AVX-512 registers:
    two independent max chains, since a vector max waits ~4 cycles on the last), else 16 or 8 (padded rows are
    whole 8s)."""
    return next(lanes for lanes in (32, 16, 8) if np_ % lanes == 0)


def _quantize_rows(sch: Any, task: Any, np_: int) -> None:
    """The row quantization inside each task, right after its rows' Y: the task's Y (m_block x N floats, its own
    buffer) is still in L1/L2, and the next layer's activations leave the kernel as int8 + one scale per row.
    The row max runs in `_row_lanes` partial maxes (rfactor: one vector max per group of columns), folded once
    per row; the quotients come from the row's reciprocal R (compute.define's `fma_quotient`)."""
    lanes_n = _row_lanes(np_)
    amax, scale, recip, q = (sch.get_sblock(name) for name in ("amax", "S", "R", "Q"))
    outer, lanes = sch.split(sch.get_loops(amax)[-1], [None, lanes_n])
    partial = sch.rfactor(lanes, 1)  # before moving: rfactor wants the reduction alone in its loops
    for block in (partial, amax, scale, recip, q):
        sch.reverse_compute_at(block, task, preserve_unit_loops=True)  # the loops below stay nameable
    lanes, rows, outer = sch.get_loops(partial)[-3:]  # rfactor put the lanes outermost
    sch.reorder(rows, outer, lanes)
    sch.reorder(*sch.get_loops(amax)[-2:][::-1])  # the fold: rows outer, each row's lanes inner
    sch.vectorize(lanes)  # before decomposing: the update block alone is not a reduction
    sch.vectorize(sch.get_loops(sch.decompose_reduction(partial, outer))[-1])
    sch.vectorize(sch.split(sch.get_loops(q)[-1], [None, lanes_n])[1])


def lower(w: Workload, cfg: Config, target: Any, out_qmax: int = 0) -> Any:
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, cfg, out_qmax))
    schedule(sch, w, cfg, out_qmax)
    return sch.mod
