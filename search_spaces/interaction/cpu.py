"""The CPU ("llvm") interaction: its knobs, the fused kernel as TVMScript, and the schedule of a config.

One pass per sample stages its F x D features in a small buffer that stays in L1 (zero padded to the vector
width), writes `x` to the front of the output row, computes only the kept dot products and writes each output
element once: no (B, F, F) intermediate, no separate concatenation. Dot products are vectorised over D with one
accumulator vector per pair (the rfactor form of the reduction); a block of pairs is computed together for
independent FMA chains, and the block's accumulators are reduced across lanes either pair by pair or all
together by a shuffle network that ends in one contiguous vector of sums (the outputs of a block's pairs are
contiguous). Blocks run along a row of the triangle (row i's chunk is loaded once for the whole block) or over
the row-major pair list; their feature offsets come from a small table built at the start of each call. The
batch is symbolic: one compiled kernel serves any batch; features, dimension and the triangle are compiled in.
"""

from __future__ import annotations

import functools
from typing import Any

from ..space import Choice, Config, Constraint, InvalidConfig, Space
from .workload import Workload

# ---- knobs --------------------------------------------------------------------------------------------
THREADING = Choice("threading", ("parallel", "serial"), doc=(
    "Samples are independent, so they spread over cores; on a small or busy machine the parallel region's "
    "launch and imbalance can cost more than the second core brings."))
SAMPLES_PER_TASK = Choice("samples_per_task", (8, 1, 2, 4, 16, 32, 64), doc=(
    "Samples one parallel task handles in a row (batch tiling): each sample's features are staged once and "
    "stay in L1 for all its pairs; larger tasks amortise the loop and keep a thread's output rows contiguous."))
LANES = Choice("lanes", (8, 16, 4, 1), doc=(
    "SIMD lanes over the dimension D (8 fp32 = one AVX2 register, 16 = one AVX-512 register; 1 = scalar, "
    "offered for D < 8 only). Each pair keeps one accumulator vector; D is zero-padded to a multiple of the "
    "lanes in the staged copy, so any D works, at the price of the padding's wasted lanes."))
PAIRS_PER_BLOCK = Choice("pairs_per_block", (8, 4, 16, 2, 32), doc=(
    "Pairs computed together (register blocking over pairs): independent accumulator chains hide FMA latency "
    "and the cross-lane reduction of a block is shared; too many accumulators spill registers."))
HSUM = Choice("hsum", ("transpose", "tree"), doc=(
    "Cross-lane reduction of a block's accumulators: 'transpose' folds all pairs' vectors together with "
    "two-source shuffles (about 3 instructions per pair, ends in one contiguous store of the block's sums); "
    "'tree' halves each pair's vector on its own (about 2 log2(lanes) instructions per pair)."))
PAIR_LAYOUT = Choice("pair_layout", ("rows", "flat"), doc=(
    "How pairs form blocks (register blocking over pairs). 'rows': a block is row i of the triangle against "
    "PB consecutive columns, so row i's chunk is loaded once per block and the other rows are at fixed "
    "offsets; rows end in partial blocks that compute up to PB-1 discarded pairs each. 'flat': PB "
    "consecutive pairs of the row-major triangle, both rows looked up per pair; no wasted pairs."))
LOOP_ORDER = Choice("loop_order", ("pairs_inner", "pairs_outer"), doc=(
    "pairs_inner walks D chunks outside and the block's pairs inside (all accumulators live at once, "
    "interleaved FMA chains); pairs_outer finishes one pair's dot product before the next (one live "
    "accumulator, a dependent FMA chain per pair)."))
DIM_UNROLL = Choice("dim_unroll", (4, 1, 2, 8, 16), doc=(
    "Unroll factor of the loop over D chunks (D padded / lanes): more independent loads in flight and less "
    "loop overhead, against code size. Must divide the number of chunks."))
COPY_LANES = Choice("copy_lanes", (8, 16, 4, 1), doc=(
    "mode=cat: SIMD lanes of the copy of each feature row into the output; must divide D."))

_STACK_FLOATS = 256  # TVM places a buffer on the stack (where LLVM can keep it in registers) below 1 KiB


def _padded_dim(w: Workload, lanes: int) -> int:
    return -(-w.dim // lanes) * lanes


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()



def _require_cpu(target: Any) -> None:
    if target.kind.name != "llvm":
        raise InvalidConfig(f"interaction has no CPU schedule for target kind {target.kind.name!r}")


def space(w: Workload, target: Any) -> Space:
    """The CPU knob space of this workload."""
    _require_cpu(target)
    common = [
        Constraint("samples_per_task only matters for parallel threading",
                   lambda c: c[THREADING] == "parallel" or c[SAMPLES_PER_TASK] == SAMPLES_PER_TASK.options[0]),
    ]
    if w.mode == "cat":
        return Space([THREADING, SAMPLES_PER_TASK, COPY_LANES.only(v for v in COPY_LANES.options if w.dim % v == 0)],
                     common)
    # lanes beyond the next power of two of D only add padding; scalar code (1 lane) is 10-30x slower once D
    # fills a vector (measured at D=64 and 128), so it is only offered for small D
    lanes = [v for v in LANES.options if v <= max(4, _next_pow2(w.dim)) and (v > 1 or w.dim < 8)]
    unrolls = [u for u in DIM_UNROLL.options if any((_padded_dim(w, v) // v) % u == 0 for v in lanes)]
    return Space(
        [THREADING, SAMPLES_PER_TASK, LANES.only(lanes), PAIRS_PER_BLOCK, PAIR_LAYOUT, HSUM, LOOP_ORDER,
         DIM_UNROLL.only(unrolls)],
        common + [
            Constraint(f"pairs_per_block x lanes accumulators must stay under {_STACK_FLOATS} floats (1 KiB): "
                       "larger blocks are heap workspaces and their accumulators leave the registers",
                       lambda c: c[PAIRS_PER_BLOCK] * c[LANES] < _STACK_FLOATS),
            Constraint("dim_unroll must divide the number of D chunks (D padded to the lanes, / lanes)",
                       lambda c: (_padded_dim(w, c[LANES]) // c[LANES]) % c[DIM_UNROLL] == 0),
        ],
    )


# ---- the computation ------------------------------------------------------------------------------------
def _reduction_levels(pairs: int, lanes: int, transpose: bool) -> list[tuple[str, int, int, int, list, list]]:
    """Shuffle levels that reduce `pairs` accumulator vectors of `lanes` lanes to the `pairs` sums, in order.

    Each level is (kind, vectors out, width in, width out, low indices, high indices); its output is
    shuffle(low) + shuffle(high). Vector m holds `seg`-lane segments, one per pair, pairs in order. "combine"
    takes two vectors and halves every segment (vectors halve), "fold" halves the segments of one vector
    (width halves). The last level leaves `pairs` floats in pair order, as ceil(pairs / lanes) vectors.
    """
    levels = []
    n, width, seg = pairs, lanes, lanes
    while seg > 1:
        segs = width // seg
        lo = [g * seg + t for g in range(segs) for t in range(seg // 2)]
        hi = [g * seg + seg // 2 + t for g in range(segs) for t in range(seg // 2)]
        if transpose and n > 1:
            levels.append(("combine", n // 2, width, width, lo + [width + i for i in lo], hi + [width + i for i in hi]))
            n //= 2
        else:
            levels.append(("fold", n, width, width // 2, lo, hi))
            width //= 2
        seg //= 2
    return levels


def compute(w: Workload, lanes: int = 8, pairs_per_block: int = 8, hsum: str = "transpose",
            pair_layout: str = "rows") -> Any:
    """The fused interaction as TVMScript, for one vector width, pair block, reduction and layout.

    Parsing the script takes a few hundred ms, so modules are cached: a build worker sees the same few
    (lanes, pairs_per_block, hsum, pair_layout) many times, and schedules never mutate their input module.
    """
    if w.mode == "cat":
        return _compute_cat(w)
    return _compute_dot(w, lanes, pairs_per_block, hsum, pair_layout)


def _row_blocks(w: Workload, pairs_per_block: int) -> list[tuple[int, int]]:
    """(row i, first column j0) of each block of the "rows" layout: rows of the triangle cut in blocks."""
    diag = int(w.self_interaction)
    return [(i, j0) for i in range(w.features) for j0 in range(0, i + diag, pairs_per_block)]


@functools.lru_cache(maxsize=64)
def _compute_dot(w: Workload, lanes: int, pairs_per_block: int, hsum: str, pair_layout: str) -> Any:
    import tvm
    from tvm.script import tirx as T

    if pairs_per_block & (pairs_per_block - 1) or lanes & (lanes - 1):
        raise InvalidConfig(f"lanes {lanes} and pairs_per_block {pairs_per_block} must be powers of two")
    if pair_layout not in PAIR_LAYOUT.options or hsum not in HSUM.options:
        raise InvalidConfig(f"unknown pair_layout {pair_layout!r} or hsum {hsum!r}")
    D, NT, F, P = w.dim, w.tables, w.features, w.pairs
    O = D + P
    VL, PB = lanes, pairs_per_block
    Dp = _padded_dim(w, VL)
    diag = 1 if w.self_interaction else 0
    rows = pair_layout == "rows"
    if rows:
        NBLK = len(_row_blocks(w, PB))
        TAB = NBLK * 4  # per block: row offset, first column's offset, output position, valid pairs
        FR = F + PB - 1  # a block may run past the diagonal: zero rows to read there
    else:
        NBLK = -(-P // PB)
        TAB = NBLK * PB * 2  # per pair: offsets of its two rows (padded with the last pair)
        FR = F
    XV = _stage_lanes(D)
    levels = _reduction_levels(PB, VL, hsum == "transpose")
    L = len(levels)
    if L > 4:
        raise InvalidConfig(f"lanes {lanes} needs more than 4 reduction levels")
    lv = levels + [("fold", 1, 2, 1, [0], [1])] * (4 - L)  # unused levels: never emitted (L guards them)
    sizes = [n * wo for _, n, _, wo, _, _ in lv]

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
    def store(sums, out, vb, start, count):
        # a block's sums are contiguous in the output row; blocks at a row's (or the triangle's) end are partial
        if count == PB:
            out[vb, T.ramp(D + start, 1, PB)] = sums[T.ramp(0, 1, PB)]
        else:
            for q in range(PB):
                if q < count:
                    out[vb, D + start + q] = sums[q]

    @T.macro
    def reduce_and_store(acc, r0, r1, r2, r3, out, vb, start, count):
        if L >= 1:
            level(acc, r0, lv[0][0], lv[0][1], lv[0][2], lv[0][3], lv[0][4], lv[0][5])
        if L >= 2:
            level(r0, r1, lv[1][0], lv[1][1], lv[1][2], lv[1][3], lv[1][4], lv[1][5])
        if L >= 3:
            level(r1, r2, lv[2][0], lv[2][1], lv[2][2], lv[2][3], lv[2][4], lv[2][5])
        if L >= 4:
            level(r2, r3, lv[3][0], lv[3][1], lv[3][2], lv[3][3], lv[3][4], lv[3][5])
        if L == 0:
            store(acc, out, vb, start, count)
        if L == 1:
            store(r0, out, vb, start, count)
        if L == 2:
            store(r1, out, vb, start, count)
        if L == 3:
            store(r2, out, vb, start, count)
        if L == 4:
            store(r3, out, vb, start, count)

    @T.prim_func(s_tir=True)
    def main(x_: T.handle, ly_: T.handle, out_: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        B = T.int64()
        x = T.match_buffer(x_, (B, D), "float32")
        ly = T.match_buffer(ly_, (B, NT, D), "float32")
        out = T.match_buffer(out_, (B, O), "float32")
        tab = T.sblock_alloc_buffer((TAB,), "int32")
        with T.sblock("pairs"):  # the triangle's enumeration, built once per call
            T.reads()
            T.writes(tab[0:TAB])
            if rows:
                n = T.sblock_alloc_buffer((1,), "int32")
                n[0] = 0
                for i in range(F):
                    for jb in range((i + diag + PB - 1) // PB):
                        tab[n[0] * 4] = i * Dp
                        tab[n[0] * 4 + 1] = jb * PB * Dp
                        tab[n[0] * 4 + 2] = (i * (i + 2 * diag - 1)) // 2 + jb * PB
                        tab[n[0] * 4 + 3] = T.min(PB, i + diag - jb * PB)
                        n[0] = n[0] + 1
            else:
                for i in range(F):
                    for j in range(i + diag):
                        tab[((i * (i + 2 * diag - 1)) // 2 + j) * 2] = i * Dp
                        tab[((i * (i + 2 * diag - 1)) // 2 + j) * 2 + 1] = j * Dp
                for p in range(NBLK * PB - P):
                    tab[(P + p) * 2] = tab[(P - 1) * 2]
                    tab[(P + p) * 2 + 1] = tab[(P - 1) * 2 + 1]
        for b in range(B):
            with T.sblock("sample"):
                vb = T.axis.spatial(B, b)
                T.reads(x[vb, 0:D], ly[vb, 0:NT, 0:D], tab[0:TAB])
                T.writes(out[vb, 0:O])
                feat = T.sblock_alloc_buffer((FR * Dp,), "float32")
                for d0 in range(D // XV):  # the dense part of the output row (plain code: one writer block)
                    for d1 in T.vectorized(XV):
                        out[vb, d0 * XV + d1] = x[vb, d0 * XV + d1]
                for d in range(D):
                    with T.sblock("stage_x"):
                        vd = T.axis.spatial(D, d)
                        feat[vd] = x[vb, vd]
                for t, d in T.grid(NT, D):
                    with T.sblock("stage_ly"):
                        vt, vd = T.axis.remap("SS", [t, d])
                        feat[(vt + 1) * Dp + vd] = ly[vb, vt, vd]
                for f, d in T.grid(F, Dp - D):
                    with T.sblock("stage_pad"):
                        vf, vd = T.axis.remap("SS", [f, d])
                        feat[vf * Dp + D + vd] = T.float32(0)
                if rows:  # zero rows past the last feature
                    for k0 in range((FR - F) * Dp // VL):
                        for k1 in T.vectorized(VL):
                            feat[F * Dp + k0 * VL + k1] = T.float32(0)
                for blk in range(NBLK):
                    with T.sblock("pair_block"):
                        vblk = T.axis.spatial(NBLK, blk)
                        T.reads(feat[0:FR * Dp], tab[0:TAB])
                        T.writes(out[vb, D:O])
                        acc = T.sblock_alloc_buffer((PB * VL,), "float32")
                        r0 = T.sblock_alloc_buffer((sizes[0],), "float32")
                        r1 = T.sblock_alloc_buffer((sizes[1],), "float32")
                        r2 = T.sblock_alloc_buffer((sizes[2],), "float32")
                        r3 = T.sblock_alloc_buffer((sizes[3],), "float32")
                        if rows:  # row i against rows j0 .. j0 + PB - 1: the row-i chunk is loaded once
                            for c, q, l in T.grid(Dp // VL, PB, VL):
                                with T.sblock("dot"):
                                    vc, vq, vl = T.axis.remap("RSS", [c, q, l])
                                    with T.init():
                                        acc[vq * VL + vl] = T.float32(0)
                                    acc[vq * VL + vl] = acc[vq * VL + vl] + (
                                        feat[tab[vblk * 4] + vc * VL + vl]
                                        * feat[tab[vblk * 4 + 1] + vq * Dp + vc * VL + vl])
                            reduce_and_store(acc, r0, r1, r2, r3, out, vb, tab[vblk * 4 + 2], tab[vblk * 4 + 3])
                        else:  # PB consecutive pairs of the row-major triangle, rows looked up per pair
                            for c, q, l in T.grid(Dp // VL, PB, VL):
                                with T.sblock("dot"):
                                    vc, vq, vl = T.axis.remap("RSS", [c, q, l])
                                    with T.init():
                                        acc[vq * VL + vl] = T.float32(0)
                                    acc[vq * VL + vl] = acc[vq * VL + vl] + (
                                        feat[tab[(vblk * PB + vq) * 2] + vc * VL + vl]
                                        * feat[tab[(vblk * PB + vq) * 2 + 1] + vc * VL + vl])
                            reduce_and_store(acc, r0, r1, r2, r3, out, vb, vblk * PB, T.min(PB, P - vblk * PB))

    return tvm.IRModule({"main": main})


def _stage_lanes(d: int) -> int:
    """Widest power-of-two vector (at most 16 lanes) that divides d: the staging copy's vector width."""
    v = 16
    while d % v:
        v //= 2
    return v


@functools.lru_cache(maxsize=8)
def _compute_cat(w: Workload) -> Any:
    """cat([x] + ly, dim=1): out[b, f*D + d] is x[b, d] for f = 0, else ly[b, f-1, d]."""
    import tvm
    from tvm.script import tirx as T

    D, NT, F = w.dim, w.tables, w.features

    @T.prim_func(s_tir=True)
    def main(x_: T.handle, ly_: T.handle, out_: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        B = T.int64()
        x = T.match_buffer(x_, (B, D), "float32")
        ly = T.match_buffer(ly_, (B, NT, D), "float32")
        out = T.match_buffer(out_, (B, F * D), "float32")
        for b, f, d in T.grid(B, F, D):
            with T.sblock("cat"):
                vb, vf, vd = T.axis.remap("SSS", [b, f, d])
                out[vb, vf * D + vd] = T.if_then_else(vf == 0, x[vb, vd], ly[vb, T.max(vf - 1, 0), vd])

    return tvm.IRModule({"main": main})


def _batch_loop(sch: Any, loop: Any, cfg: Config) -> None:
    if cfg[THREADING] == "parallel":
        outer, _ = sch.split(loop, [None, cfg[SAMPLES_PER_TASK]])
        sch.parallel(outer)


def _schedule(sch: Any, w: Workload, cfg: Config) -> None:
    """Apply a CPU config to `compute(w, cfg[LANES], cfg[PAIRS_PER_BLOCK], cfg[HSUM], cfg[PAIR_LAYOUT])`."""
    if w.mode == "cat":
        vec = cfg[COPY_LANES]
        if w.dim % vec:
            raise InvalidConfig(f"copy_lanes {vec} does not divide dim {w.dim}")
        b, _, d = sch.get_loops(sch.get_sblock("cat"))
        _batch_loop(sch, b, cfg)
        if vec > 1:
            _, dv = sch.split(d, [None, vec])
            sch.vectorize(dv)
        return

    vec, unroll = cfg[LANES], cfg[DIM_UNROLL]
    chunks = _padded_dim(w, vec) // vec
    if chunks % unroll:
        raise InvalidConfig(f"dim_unroll {unroll} does not divide the {chunks} chunks of {vec} lanes")
    if cfg[PAIRS_PER_BLOCK] * vec >= _STACK_FLOATS:
        raise InvalidConfig(f"pairs_per_block {cfg[PAIRS_PER_BLOCK]} x lanes {vec} accumulators exceed the stack")
    (b,) = sch.get_loops(sch.get_sblock("sample"))
    _batch_loop(sch, b, cfg)

    xv = _stage_lanes(w.dim)
    for name in ("stage_x", "stage_ly"):
        d = sch.get_loops(sch.get_sblock(name))[-1]
        if xv > 1:
            _, dv = sch.split(d, [None, xv])
            sch.vectorize(dv)
    if _padded_dim(w, vec) > w.dim:
        sch.vectorize(sch.get_loops(sch.get_sblock("stage_pad"))[-1])

    dot = sch.get_sblock("dot")
    c, q, lane = sch.get_loops(dot)[-3:]
    co, ci = sch.split(c, [None, unroll])
    if cfg[LOOP_ORDER] == "pairs_outer":
        sch.reorder(q, co, ci)
    if vec > 1:
        sch.vectorize(lane)
    sch.unroll(q)  # the block's accumulators: unrolled, they are registers
    if unroll > 1:
        sch.unroll(ci)
    init = sch.decompose_reduction(dot, sch.get_loops(dot)[-4])
    iq, il = sch.get_loops(init)[-2:]
    sch.unroll(iq)
    if vec > 1:
        sch.vectorize(il)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The scheduled IRModule for one CPU config: what `tvm.compile` builds."""
    from tvm.s_tir import Schedule

    _require_cpu(target)
    if w.mode == "cat":
        sch = Schedule(compute(w))
    else:
        sch = Schedule(compute(w, cfg[LANES], cfg[PAIRS_PER_BLOCK], cfg[HSUM], cfg[PAIR_LAYOUT]))
    _schedule(sch, w, cfg)
    return sch.mod
