"""The fused CPU kernel as TVMScript: each sample's bags pooled straight from the tables into its features,
then its dot interaction, without the (B, T, D) pooled rows between them.

Per sample (the samples spread over cores):
  1. x is written to the front of the output row and staged as feature 0 of a small per-sample buffer (F rows
     of D floats zero-padded to the SIMD width, the interaction kernel's: it stays in L1);
  2. each table's bag is pooled from the tables into feature t + 1, through a register accumulator (`local`)
     or straight into the buffer; every index is checked against its own table (one outside is not read and
     sets the error flag) and the rows of the same table's bag `prefetch` samples ahead are prefetched first,
     so later samples' rows arrive while this one computes. Each table's indices and offsets are read where
     the caller holds them: the `bags` argument gives their addresses (workload.BAG_FIELDS), so a call needs
     no copy of them into one layout;
  3. the kept dot products, the interaction kernel's way (search_spaces.interaction.cpu): blocks of pairs along
     a row of the triangle, one SIMD accumulator per pair, reduced across lanes by a shuffle network
     (`hsum`: "transpose" or "tree"), each block's sums stored once, contiguous in the output row.
Two orders (cpu.py's `order`): sample by sample, steps 1-3 for one sample, then the next ("sample" blocks); or
table by table over a block of samples ("task" blocks), step 2 for each table's bags of the block in turn (one
index stream and one table's rows at a time, the prefetch a few bags ahead in them), the features of the whole
block staged, then steps 1 and 3 per sample.
Offsets (per table, against its first index and end) and table offsets are checked as boundaries before the
gather (embedding_bag's kernel.py); when they are bad nothing is gathered and the output is zeros. The batch is
symbolic; tables, dimension, triangle and row format are compiled in.
"""

from __future__ import annotations

import functools
from typing import Any

from .. import _amx_tiles as amx_tiles
from ..embedding_bag.cpu import SCRATCH_SCOPE
from ..embedding_bag.kernel import boundaries_checker, flag_where, in_range, index_alignment, prefetcher
from ..embedding_bag.workload import INDEX_ERROR, OFFSETS_ERROR, TABLE_OFFSETS_ERROR
# the interaction kernel's pieces that are plain Python (its TVMScript is its own: a module may not be edited
# without staling its shipped records, and its macros live inside one function)
from ..interaction.cpu import _next_pow2, _padded_dim, _reduction_levels, _row_blocks, _stage_lanes
from ..space import InvalidConfig
from .workload import BAG_END, BAG_FIELDS, BAG_FIRST, BAG_INDICES, BAG_OFFSETS, Workload

# the extent declared for a table's indices and offsets, which lie at addresses the `bags` argument gives: their
# lengths are the caller's (its columns' first and end, checked by `check_bags` before any index is read)
SPAN = 1 << 40

__all__ = ["AMX_MAX_FEATURES", "amx_fits", "compute", "feature_lanes", "next_pow2", "padded_dim"]

next_pow2 = _next_pow2
AMX_ROWS = amx_tiles.ROWS  # a tile's rows: features per row block of the Gram matrix
AMX_K = 32  # bf16 values a tile row holds (64 bytes): the dimension runs in steps of it
AMX_MAX_FEATURES = 2 * AMX_ROWS  # the Gram matrix's tiles on and below the diagonal (3) + 2 A + 2 B fit 8 tiles


def amx_fits(w: Workload) -> bool:
    """Whether the dot products may run on AMX tiles: bf16 products allowed (`dot_dtype`), at most AMX_MAX_FEATURES
    features and a dimension of whole tile rows."""
    return w.dot_dtype == "bfloat16" and w.dots.features <= AMX_MAX_FEATURES and w.dim % AMX_K == 0


def padded_dim(w: Workload, lanes: int) -> int:
    """D rounded up to the dot products' SIMD width: a staged feature's length."""
    return _padded_dim(w.dots, lanes)


def feature_lanes(w: Workload) -> int:
    """The SIMD width of the pooling and of the staging copies: the widest power of two (up to 16) dividing D."""
    return _stage_lanes(w.dim)


@functools.lru_cache(maxsize=64)
def compute(w: Workload, lanes: int = 8, pairs_per_block: int = 8, hsum: str = "transpose", prefetch: int = 0,
            prefetch_lines: int = 1, unroll: int = 1, local: bool = True, amx_every: int = 0,
            index_ahead: int = 0, table_block: int = 0) -> Any:
    """The fused kernel for one dot-product SIMD width, pair block and cross-lane reduction, prefetch distance
    (samples; 0: none) and width (cache lines of a row), rows unrolled per bag, and accumulator; `amx_every` > 0:
    the dot products on AMX tiles instead (`amx_fits`; the tile configuration loaded at every sample whose
    index is a multiple of it: each parallel task's first); `table_block` > 0: the bags of blocks of that many
    samples pooled table by table (the block "task"), else sample by sample (the block "sample"). Cached:
    parsing takes a few hundred ms (cpu.lower schedules a copy)."""
    import tvm
    from tvm.script import tirx as T

    if amx_every and not amx_fits(w):
        raise InvalidConfig(f"AMX dot products need at most {AMX_MAX_FEATURES} features and a dim that is a multiple "
                            f"of {AMX_K}, and bf16 products allowed (dot_dtype=bfloat16)")
    if pairs_per_block & (pairs_per_block - 1) or lanes & (lanes - 1):
        raise InvalidConfig(f"lanes {lanes} and pairs_per_block {pairs_per_block} must be powers of two")
    if hsum not in ("transpose", "tree"):
        raise InvalidConfig(f"unknown hsum {hsum!r}")
    if unroll < 1 or prefetch < 0 or table_block < 0:
        raise ValueError(f"unroll must be positive, prefetch and table_block not negative, got {unroll}, {prefetch} "
                         f"and {table_block}")
    dw = w.dots
    D, NT, F, P = w.dim, w.tables, dw.features, dw.pairs
    O = D + P
    VL, PB, U, V = lanes, pairs_per_block, unroll, feature_lanes(w)
    Dp = padded_dim(w, VL)
    diag = 1 if w.self_interaction else 0
    NBLK = len(_row_blocks(dw, PB))
    TAB = NBLK * 4  # per block: row offset, first column's offset, output position, valid pairs
    FR = F + PB - 1  # a block may run past the diagonal: zero rows to read there
    FS = FR * Dp  # one sample's staged features (its rows padded to Dp, then the zero rows)
    TB = table_block  # samples a task pools table by table (0: sample by sample)
    levels = _reduction_levels(PB, VL, hsum == "transpose")
    L = len(levels)
    if L > 4:
        raise InvalidConfig(f"lanes {lanes} needs more than 4 reduction levels")
    lv = levels + [("fold", 1, 2, 1, [0], [1])] * (4 - L)  # unused levels: never emitted (L guards them)
    sizes = [n * wo for _, n, _, wo, _, _ in lv]
    fmt = w.rows_format
    WD, idt, i64 = fmt.width, w.index_dtype, "int64"
    ialign = index_alignment(idt)
    prefetch_row = prefetcher(prefetch_lines, fmt)
    flag_if = flag_where()
    check_boundaries = boundaries_checker()

    # ---- the bags: table t's indices and offsets lie where the caller holds them (`Bags`, workload.py) -------
    def address(Bags: Any, field: int, vt: Any) -> Any:
        """Where table vt's indices (field BAG_INDICES) or offsets (BAG_OFFSETS) lie."""
        return T.reinterpret("handle", Bags[field, vt])

    def start(Ot: Any, vb: Any) -> Any:
        return T.Cast(i64, Ot[vb])

    def end(Bags: Any, Ot: Any, vt: Any, vb: Any, NB: Any) -> Any:
        """Bag vb's end: the next bag's start, or past the last bag the end of the table's indices (a lazy
        select: Ot holds NB entries)."""
        return T.if_then_else(vb + 1 < NB, T.Cast(i64, Ot[T.min(vb + 1, NB - 1)]), Bags[BAG_END, vt])

    def count(Bags: Any, Ot: Any, vt: Any, vb: Any, NB: Any) -> Any:
        return end(Bags, Ot, vt, vb, NB) - start(Ot, vb)

    def index(It: Any, Ot: Any, vb: Any, vl: Any) -> Any:
        return T.Cast(i64, It[start(Ot, vb) + vl])

    def rows_of(TO: Any, vt: Any) -> Any:
        return TO[vt + 1] - TO[vt]

    def lanes_of(n: int) -> Any:
        return T.vectorized(n) if n > 1 else T.serial(n)

    def rows_in(name: str) -> Any:
        """A macro `pool_row(W, S, TO, Bags, It, Ot, A, base, Flag, vt, vb, l, NB)`: row l of bag (vt, vb) added
        to A[base:base + D] when its index lies in its table, else the flag set (one macro per block name:
        TVMScript renames a block where its macro is expanded again)."""

        @T.macro
        def add_row(W, S, TO, Bags, It, Ot, A, base, vt, vb, l, NB):
            for dm in T.unroll(D // V):
                for dv in lanes_of(V):
                    with T.sblock(name):
                        vl = T.axis.reduce(count(Bags, Ot, vt, vb, NB), l)
                        vd = T.axis.spatial(D, dm * V + dv)
                        A[base + vd] = A[base + vd] + fmt.load(W, S, TO[vt] + index(It, Ot, vb, vl), vd)

        @T.macro
        def pool_row(W, S, TO, Bags, It, Ot, A, base, Flag, vt, vb, l, NB):
            if in_range(index(It, Ot, vb, l), rows_of(TO, vt)):
                add_row(W, S, TO, Bags, It, Ot, A, base, vt, vb, l, NB)
            else:
                flag_if(Flag, True, INDEX_ERROR)

        return pool_row

    group_row, tail_row = rows_in("acc"), rows_in("acc_tail")

    @T.macro
    def prefetch_ahead(W, TO, Bags, It, Ot, vt, vb, NB, R):
        # the rows of this table's bag `prefetch` samples ahead (the last sample's past the batch: a wasted
        # prefetch, never a read outside it; each row clamped into the table: a hint, never a fault)
        for k in range(count(Bags, Ot, vt, T.min(vb + prefetch, NB - 1), NB)):
            prefetch_row(W, T.min(TO[vt] + index(It, Ot, T.min(vb + prefetch, NB - 1), k), R - 1))

    @T.macro
    def pool(W, S, TO, Bags, It, Ot, A, base, Flag, vt, vb, NB, R):
        """Bag (vt, vb)'s rows summed into A[base:base + D], in one block (its only writer seen from outside)."""
        with T.sblock("pool"):
            T.reads(Bags[0:BAG_FIELDS, 0:NT], TO[vt:vt + 2], W[0:R, 0:WD])
            T.writes(A[base:base + D])
            for d0 in range(D):
                with T.sblock("acc_init"):
                    vd0 = T.axis.spatial(D, d0)
                    A[base + vd0] = T.float32(0)
            if prefetch > 0:
                prefetch_ahead(W, TO, Bags, It, Ot, vt, vb, NB, R)
            if U == 1:
                for l in range(count(Bags, Ot, vt, vb, NB)):
                    group_row(W, S, TO, Bags, It, Ot, A, base, Flag, vt, vb, l, NB)
            else:
                for g in range(count(Bags, Ot, vt, vb, NB) // U):
                    for u in T.unroll(T.int64(U)):
                        group_row(W, S, TO, Bags, It, Ot, A, base, Flag, vt, vb, g * U + u, NB)
                for r in range(count(Bags, Ot, vt, vb, NB) % U):
                    tail_row(W, S, TO, Bags, It, Ot, A, base, Flag, vt, vb, count(Bags, Ot, vt, vb, NB) // U * U + r,
                             NB)

    @T.macro
    def prefetch_indices(Bags, It, Ot, vt, vb, NB):
        # each table's offsets and indices are read sample by sample: one stream per table, more than the
        # hardware's prefetchers follow; the offsets 2 x index_ahead samples ahead, the indices index_ahead
        # (their offsets fetched by then)
        with T.sblock("prefetch_indices"):
            T.reads()
            T.writes()
            T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0",
                                          T.address_of(Ot[T.min(vb + 2 * index_ahead, NB - 1)]), 0, 3, 1))
            T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(It[T.max(T.min(
                T.Cast(i64, Ot[T.min(vb + index_ahead, NB - 1)]), Bags[BAG_END, vt] - 1), T.int64(0))]), 0, 3, 1))

    @T.macro
    def check_bags(Bags, Flag, NB):
        # each table's offsets as boundaries: from its first index, non-decreasing, the last within its end
        # (one pass per table that LLVM vectorises: the flag OR-ed in a register, without a branch)
        for t in range(NT):
            with T.sblock("check_bags"):
                vt = T.axis.spatial(NT, t)
                T.reads(Bags[0:BAG_FIELDS, vt])
                T.writes(Flag[0])
                Ot = T.decl_buffer((SPAN,), idt, data=address(Bags, BAG_OFFSETS, vt), align=ialign)
                Flag[0] = T.bitwise_or(Flag[0], T.Select(T.Cast(i64, Ot[0]) != Bags[BAG_FIRST, vt],
                                                         T.int32(OFFSETS_ERROR), T.int32(0)))
                for i in range(NB - 1):
                    Flag[0] = T.bitwise_or(Flag[0], T.Select(Ot[i + 1] < Ot[i], T.int32(OFFSETS_ERROR), T.int32(0)))
                Flag[0] = T.bitwise_or(Flag[0], T.Select(T.Cast(i64, Ot[NB - 1]) > Bags[BAG_END, vt],
                                                         T.int32(OFFSETS_ERROR), T.int32(0)))

    # ---- the dot products (the interaction kernel's "rows" layout) -----------------------------------------
    @T.macro
    def level(src, dst, kind, n_out, w_in, w_out, lo, hi):
        for m in T.unroll(n_out):
            if kind == "combine":
                dst[T.ramp(m * w_out, 1, w_out)] = (
                    T.Shuffle([src[T.ramp(2 * m * w_in, 1, w_in)], src[T.ramp((2 * m + 1) * w_in, 1, w_in)]], lo)
                    + T.Shuffle([src[T.ramp(2 * m * w_in, 1, w_in)], src[T.ramp((2 * m + 1) * w_in, 1, w_in)]], hi))
            elif w_out == 1:  # the last fold of "tree": one float per pair
                dst[m] = src[m * w_in] + src[m * w_in + 1]
            else:
                dst[T.ramp(m * w_out, 1, w_out)] = (T.Shuffle([src[T.ramp(m * w_in, 1, w_in)]], lo)
                                                    + T.Shuffle([src[T.ramp(m * w_in, 1, w_in)]], hi))

    @T.macro
    def store(sums, Out, vb, start_, count_):
        # a block's sums are contiguous in the output row; blocks at a row's end are partial
        if count_ == PB:
            Out[vb, T.ramp(D + start_, 1, PB)] = sums[T.ramp(0, 1, PB)]
        else:
            for q in range(PB):
                if q < count_:
                    Out[vb, D + start_ + q] = sums[q]

    @T.macro
    def reduce_and_store(acc, r0, r1, r2, r3, Out, vb, start_, count_):
        if L >= 1:
            level(acc, r0, lv[0][0], lv[0][1], lv[0][2], lv[0][3], lv[0][4], lv[0][5])
        if L >= 2:
            level(r0, r1, lv[1][0], lv[1][1], lv[1][2], lv[1][3], lv[1][4], lv[1][5])
        if L >= 3:
            level(r1, r2, lv[2][0], lv[2][1], lv[2][2], lv[2][3], lv[2][4], lv[2][5])
        if L >= 4:
            level(r2, r3, lv[3][0], lv[3][1], lv[3][2], lv[3][3], lv[3][4], lv[3][5])
        if L == 0:
            store(acc, Out, vb, start_, count_)
        if L == 1:
            store(r0, Out, vb, start_, count_)
        if L == 2:
            store(r1, Out, vb, start_, count_)
        if L == 3:
            store(r2, Out, vb, start_, count_)
        if L == 4:
            store(r3, Out, vb, start_, count_)

    # ---- the dot products on AMX tiles (amx_every > 0) -----------------------------------------------------
    # The Gram matrix of the sample's features, G = X X^T (X: FT x D, features padded to whole tiles), on
    # bf16 roundings of X with fp32 sums (`tdpbf16ps`): A tiles are X's rows as they are (bf16 pairs), B tiles
    # X^T in the pair-interleaved layout AMX reads, i.e. X's 16 x 16 blocks of bf16 pairs transposed. Only the
    # tiles on and below the diagonal are computed; the kept triangle is copied row by row into the output.
    KS, FT = D // AMX_K, AMX_ROWS * (2 if F > AMX_ROWS else 1)
    MT = FT // AMX_ROWS
    a_tile, b_tile = 3, 5  # + row block / column block
    zip_lo = [i // 2 + (16 if i % 2 else 0) for i in range(16)]
    zip_hi = [8 + i // 2 + (16 if i % 2 else 0) for i in range(16)]
    # the triangle's rows as (first, end, width): full-width vector copies while a row's copy stays in the output
    # row (its spill past the kept entries is overwritten by the next rows), then one entry at a time
    spans, i0 = [], 1 - diag
    for width in (AMX_ROWS, FT):
        i1 = i0
        while i1 < F and i1 + diag <= width and (i1 * (i1 + 2 * diag - 1)) // 2 + width <= P:
            i1 += 1
        spans.append((i0, i1, width))
        i0 = i1

    load_tile_config = amx_tiles.tile_config()

    @T.macro
    def tile_config(vb):
        if vb % amx_every == 0:  # a task's first sample: its thread's tiles may hold another kernel's shapes
            load_tile_config()

    @T.macro
    def transpose_pairs(A, Bt, s, nb):
        # Bt[s, nb] = the 16 x 16 block of bf16 pairs A[nb*16 .., s*16 ..] transposed: four rounds of zips
        v0 = T.sblock_alloc_buffer((256,), "int32")
        v1 = T.sblock_alloc_buffer((256,), "int32")
        for r in T.unroll(16):
            v0[T.ramp(r * 16, 1, 16)] = A[nb * 16 + r, T.ramp(s * 16, 1, 16)]
        for rnd in T.unroll(2):  # rounds 1 and 3 into v1, 2 and 4 back into v0
            for j in T.unroll(8):
                v1[T.ramp(2 * j * 16, 1, 16)] = T.Shuffle(
                    [v0[T.ramp(j * 16, 1, 16)], v0[T.ramp((j + 8) * 16, 1, 16)]], zip_lo)
                v1[T.ramp((2 * j + 1) * 16, 1, 16)] = T.Shuffle(
                    [v0[T.ramp(j * 16, 1, 16)], v0[T.ramp((j + 8) * 16, 1, 16)]], zip_hi)
            for j in T.unroll(8):
                v0[T.ramp(2 * j * 16, 1, 16)] = T.Shuffle(
                    [v1[T.ramp(j * 16, 1, 16)], v1[T.ramp((j + 8) * 16, 1, 16)]], zip_lo)
                v0[T.ramp((2 * j + 1) * 16, 1, 16)] = T.Shuffle(
                    [v1[T.ramp(j * 16, 1, 16)], v1[T.ramp((j + 8) * 16, 1, 16)]], zip_hi)
        for r in T.unroll(16):
            Bt[s, nb, r, T.ramp(0, 1, 16)] = v0[T.ramp(r * 16, 1, 16)]

    @T.macro
    def amx_dots(feat, fb, Out, vb):
        with T.sblock("amx_dots"):
            T.reads(feat[fb:fb + FS])
            T.writes(Out[vb, D:O])
            A = T.sblock_alloc_buffer((FT, D // 2), "int32")  # bf16 pairs
            Bt = T.sblock_alloc_buffer((KS, MT, 16, 16), "int32")
            G = T.sblock_alloc_buffer((FT, FT), "float32")
            tile_config(vb)
            for f in range(F):
                for c in T.unroll(KS):
                    A[f, T.ramp(c * 16, 1, 16)] = T.reinterpret("int32x16", T.call_llvm_pure_intrin(
                        "int16x32", "llvm.x86.avx512bf16.cvtne2ps2bf16.512",
                        feat[T.ramp(fb + f * Dp + c * AMX_K + 16, 1, 16)], feat[T.ramp(fb + f * Dp + c * AMX_K, 1, 16)]))
            for s in T.unroll(KS):
                for nb in T.unroll(MT):
                    transpose_pairs(A, Bt, s, nb)
            for mi in T.unroll(MT):
                for nj in T.unroll(MT):
                    if nj <= mi:  # on and below the diagonal
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.int8(mi * (mi + 1) // 2 + nj)))
            for s in T.unroll(KS):
                for mi in T.unroll(MT):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(a_tile + mi),
                                                  T.address_of(A[mi * 16, s * 16]), T.int64(D * 2)))
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(b_tile + mi),
                                                  T.address_of(Bt[s, mi, 0, 0]), T.int64(64)))
                for mi in T.unroll(MT):
                    for nj in T.unroll(MT):
                        if nj <= mi:
                            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbf16ps", T.int8(mi * (mi + 1) // 2 + nj),
                                                          T.int8(a_tile + mi), T.int8(b_tile + nj)))
            for mi in T.unroll(MT):
                for nj in T.unroll(MT):
                    if nj <= mi:
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(mi * (mi + 1) // 2 + nj),
                                                      T.address_of(G[mi * 16, nj * 16]), T.int64(FT * 4)))
            for i in range(spans[0][0], spans[0][1]):
                Out[vb, T.ramp(D + (i * (i + 2 * diag - 1)) // 2, 1, spans[0][2])] = G[i, T.ramp(0, 1, spans[0][2])]
            for i in range(spans[1][0], spans[1][1]):
                Out[vb, T.ramp(D + (i * (i + 2 * diag - 1)) // 2, 1, spans[1][2])] = G[i, T.ramp(0, 1, spans[1][2])]
            for i in range(spans[1][1], F):
                for j in range(i + diag):
                    Out[vb, D + (i * (i + 2 * diag - 1)) // 2 + j] = G[i, j]

    @T.macro
    def dots(feat, fb, tab, Out, vb):
        for k0 in range((FR - F) * Dp // VL):  # zero rows past the last feature
            for k1 in T.vectorized(VL):
                feat[fb + F * Dp + k0 * VL + k1] = T.float32(0)
        for blk in range(NBLK):
            with T.sblock("pair_block"):
                vblk = T.axis.spatial(NBLK, blk)
                T.reads(feat[fb:fb + FS], tab[0:TAB])
                T.writes(Out[vb, D:O])
                acc = T.sblock_alloc_buffer((PB * VL,), "float32")
                r0 = T.sblock_alloc_buffer((sizes[0],), "float32")
                r1 = T.sblock_alloc_buffer((sizes[1],), "float32")
                r2 = T.sblock_alloc_buffer((sizes[2],), "float32")
                r3 = T.sblock_alloc_buffer((sizes[3],), "float32")
                # row i against rows j0 .. j0 + PB - 1: the row-i chunk is loaded once
                for c, q, ln in T.grid(Dp // VL, PB, VL):
                    with T.sblock("dot"):
                        vc, vq, vl = T.axis.remap("RSS", [c, q, ln])
                        with T.init():
                            acc[vq * VL + vl] = T.float32(0)
                        acc[vq * VL + vl] = acc[vq * VL + vl] + (
                            feat[fb + tab[vblk * 4] + vc * VL + vl]
                            * feat[fb + tab[vblk * 4 + 1] + vq * Dp + vc * VL + vl])
                reduce_and_store(acc, r0, r1, r2, r3, Out, vb, tab[vblk * 4 + 2], tab[vblk * 4 + 3])

    # ---- one sample's pieces, then the two orders ----------------------------------------------------------
    @T.macro
    def stage_x(X, Out, feat, fb, vb):
        for d0 in range(D // V):  # the dense part of the output row (plain code: one writer block)
            for d1 in lanes_of(V):
                Out[vb, d0 * V + d1] = X[vb, d0 * V + d1]
        for d in range(D):
            with T.sblock("stage_x"):
                vd = T.axis.spatial(D, d)
                feat[fb + vd] = X[vb, vd]

    @T.macro
    def bag(W, S, TO, Bags, It, Ot, feat, fb, Flag, vt, vb, NB, R):
        # bag (vt, vb) pooled into the staged feature vt + 1 of the sample whose features start at fb
        if index_ahead > 0:
            prefetch_indices(Bags, It, Ot, vt, vb, NB)
        if local:
            A = T.sblock_alloc_buffer((D,), "float32", scope=SCRATCH_SCOPE)
            pool(W, S, TO, Bags, It, Ot, A, 0, Flag, vt, vb, NB, R)
            for d2 in range(D):
                with T.sblock("stage_bag"):
                    vd2 = T.axis.spatial(D, d2)
                    feat[fb + (vt + 1) * Dp + vd2] = A[vd2]
        else:
            pool(W, S, TO, Bags, It, Ot, feat, fb + (vt + 1) * Dp, Flag, vt, vb, NB, R)

    @T.macro
    def interact(feat, fb, tab, Out, vb):
        for f, d in T.grid(F, Dp - D):
            with T.sblock("stage_pad"):
                vf, vd = T.axis.remap("SS", [f, d])
                feat[fb + vf * Dp + D + vd] = T.float32(0)
        if amx_every > 0:
            amx_dots(feat, fb, Out, vb)
        else:
            dots(feat, fb, tab, Out, vb)

    @T.macro
    def by_sample(X, W, S, TO, Bags, Out, Flag, tab, NB, R):
        # each sample's bags (one per table), then its dot products: its features stay in L1
        for b in range(NB):
            with T.sblock("sample"):
                vb = T.axis.spatial(NB, b)
                T.reads(X[vb, 0:D], Bags[0:BAG_FIELDS, 0:NT], TO[0:NT + 1], W[0:R, 0:WD], tab[0:TAB])
                T.writes(Out[vb, 0:O])  # and the flag (a benign race: not a region the schedule orders)
                feat = T.sblock_alloc_buffer((FS,), "float32")
                stage_x(X, Out, feat, 0, vb)
                for t in range(NT):
                    with T.sblock("bag"):
                        vt = T.axis.spatial(NT, t)
                        T.reads(Bags[0:BAG_FIELDS, 0:NT], TO[vt:vt + 2], W[0:R, 0:WD])
                        T.writes(feat[(vt + 1) * Dp:(vt + 1) * Dp + D])
                        It = T.decl_buffer((SPAN,), idt, data=address(Bags, BAG_INDICES, vt), align=ialign)
                        Ot = T.decl_buffer((SPAN,), idt, data=address(Bags, BAG_OFFSETS, vt), align=ialign)
                        bag(W, S, TO, Bags, It, Ot, feat, 0, Flag, vt, vb, NB, R)
                interact(feat, 0, tab, Out, vb)

    @T.macro
    def by_table(X, W, S, TO, Bags, Out, Flag, tab, NB, R):
        # blocks of TB samples: their bags table by table (one table's index stream and rows at a time, the
        # prefetch a few bags ahead in it), then each sample's dot products
        for g in range((NB + TB - 1) // TB):
            with T.sblock("task"):
                vg = T.axis.spatial((NB + TB - 1) // TB, g)
                T.reads(X[0:NB, 0:D], Bags[0:BAG_FIELDS, 0:NT], TO[0:NT + 1], W[0:R, 0:WD], tab[0:TAB])
                T.writes(Out[0:NB, 0:O])  # rows vg * TB onwards (and the flag, as by_sample's)
                feat = T.sblock_alloc_buffer((TB * FS,), "float32")
                for t in range(NT):
                    with T.sblock("bag"):
                        vt = T.axis.spatial(NT, t)
                        T.reads(Bags[0:BAG_FIELDS, 0:NT], TO[vt:vt + 2], W[0:R, 0:WD])
                        T.writes(feat[0:TB * FS])
                        It = T.decl_buffer((SPAN,), idt, data=address(Bags, BAG_INDICES, vt), align=ialign)
                        Ot = T.decl_buffer((SPAN,), idt, data=address(Bags, BAG_OFFSETS, vt), align=ialign)
                        for s in range(T.min(T.int64(TB), NB - vg * TB)):
                            with T.sblock("bag_of_sample"):  # its blocks see the sample as a block var
                                vs = T.axis.spatial(TB, s)
                                T.reads(Bags[0:BAG_FIELDS, 0:NT], TO[vt:vt + 2], W[0:R, 0:WD])
                                T.writes(feat[vs * FS + (vt + 1) * Dp:vs * FS + (vt + 1) * Dp + D])
                                bag(W, S, TO, Bags, It, Ot, feat, vs * FS, Flag, vt, vg * TB + vs, NB, R)
                for s in range(T.min(T.int64(TB), NB - vg * TB)):
                    with T.sblock("sample"):
                        vs = T.axis.spatial(TB, s)
                        T.reads(X[vg * TB + vs, 0:D], feat[vs * FS:vs * FS + FS], tab[0:TAB])
                        T.writes(Out[vg * TB + vs, 0:O])
                        stage_x(X, Out, feat, vs * FS, vg * TB + vs)
                        interact(feat, vs * FS, tab, Out, vg * TB + vs)

    @T.macro
    def body(X, W, S, TO, Bags, Out, Flag, tab, NB, R):
        check_boundaries(TO, Flag, NT + 1, R, TABLE_OFFSETS_ERROR)
        check_bags(Bags, Flag, NB)
        if T.bitwise_and(Flag[0], T.int32(OFFSETS_ERROR | TABLE_OFFSETS_ERROR)) == T.int32(0):
            if TB > 0:
                by_table(X, W, S, TO, Bags, Out, Flag, tab, NB, R)
            else:
                by_sample(X, W, S, TO, Bags, Out, Flag, tab, NB, R)
        else:  # flagged: zeros, not whatever the output's memory held
            for b, d in T.grid(NB, O):
                with T.sblock("zero"):
                    vb, vd = T.axis.remap("SS", [b, d])
                    Out[vb, vd] = T.float32(0)

    @T.prim_func(s_tir=True)
    def main(x_: T.handle, w_: T.handle, toff: T.handle, bags: T.handle, out_: T.handle, flag: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        NB = T.int64()
        R = T.int64()
        X = T.match_buffer(x_, (NB, D), "float32")
        W = T.match_buffer(w_, (R, WD), fmt.storage)
        TO = T.match_buffer(toff, (NT + 1,), "int64", align=8)
        Bags = T.match_buffer(bags, (BAG_FIELDS, NT), "int64", align=8)  # NumPy's memory (bag_columns)
        Out = T.match_buffer(out_, (NB, O), "float32")
        Flag = T.match_buffer(flag, (1,), "int32")
        tab = T.sblock_alloc_buffer((TAB,), "int32")
        if amx_every == 0:
            with T.sblock("pairs"):  # the triangle's blocks, listed once per call
                T.reads()
                T.writes(tab[0:TAB])
                n = T.sblock_alloc_buffer((1,), "int32")
                n[0] = 0
                for i in range(F):
                    for jb in range((i + diag + PB - 1) // PB):
                        tab[n[0] * 4] = i * Dp
                        tab[n[0] * 4 + 1] = jb * PB * Dp
                        tab[n[0] * 4 + 2] = (i * (i + 2 * diag - 1)) // 2 + jb * PB
                        tab[n[0] * 4 + 3] = T.min(PB, i + diag - jb * PB)
                        n[0] = n[0] + 1
        if fmt.fused:
            S = fmt.scales(W)
            body(X, W, S, TO, Bags, Out, Flag, tab, NB, R)
        else:
            body(X, W, W, TO, Bags, Out, Flag, tab, NB, R)  # S unused: the table stands in

    return tvm.IRModule({"main": main})
