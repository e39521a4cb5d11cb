"""DLRM dot interaction: pairwise dot products of one sample's features, fused with the dense concatenation.

Semantics are facebookresearch/dlrm's `interact_features`: the F = T + 1 features of a sample are the dense
vector `x` (first) and the T sparse embeddings `ly` (in order); `Z = T·Tᵀ` per sample, and the output row is
`cat([x, Z[li, lj]])` where (li, lj) walks the strict lower triangle in row-major order
(`torch.tril_indices(F, F, offset=-1)`), or the triangle with its diagonal when `self_interaction` is on.
`mode=cat` is DLRM's other interaction, `cat([x] + ly, dim=1)`, a plain copy kernel.

The kernel is fused: one pass per sample stages its F x D features in a small buffer that stays in L1 (zero
padded to the vector width), writes `x` to the front of the output row, computes only the F(F-1)/2 (or
F(F+1)/2) dot products that are kept, and writes each output element once: no (B, F, F) intermediate, no
separate concatenation. Dot products are vectorised over D with one accumulator vector per pair (the rfactor
form of the reduction); a block of pairs is computed together for independent FMA chains, and the block's
accumulators are reduced across lanes either pair by pair or all together by a shuffle network that ends in
one contiguous vector of sums (the outputs of a block's pairs are contiguous). Blocks run along a row of the
triangle (row i's chunk is loaded once for the whole block) or over the row-major pair list; their feature
offsets come from a small table built at the start of each call. The batch is symbolic: one compiled
kernel serves any batch; features, dimension and the triangle are compiled in.

On CUDA targets (see the CUDA section below) a thread block stages a few samples' features in shared memory
with 16-byte loads, computes the kept triangle of each Z in register tiles, each tile split over a few lanes
that meet in warp shuffles, and writes each output row once, coalesced. That kernel is written at the
thread level (`compute_cuda`), not scheduled from a compute: its grid is sized for the tuned batch and loops
over larger ones.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .space import Choice, Config, Constraint, InvalidConfig, Space
from .template import Traffic, Workload as _Workload, WorkloadError

NAME = "interaction"
DOC = ("DLRM interact_features: x and T embeddings -> cat([x, tril(Z = T T^T)]), fused (dot), "
       "or cat([x] + ly) (cat)")

EXAMPLE_SHAPE = "batch=2048,tables=26,dim=64"

WEIGHTS: tuple[int, ...] = ()  # no model weights: both inputs are activations

MODES = ("dot", "cat")
DTYPES = ("float32",)


@dataclass(frozen=True)
class Workload(_Workload):
    """One interaction call: batch, number of embedding tables T (features F = T + 1), dimension D.

    `self_interaction` keeps the diagonal of Z (DLRM's `arch_interaction_itself`); `mode` is "dot" (pairwise
    dot products) or "cat" (plain concatenation). Only float32 is implemented.
    """

    batch: int
    tables: int
    dim: int
    self_interaction: bool = False
    mode: str = "dot"
    dtype: str = "float32"

    SHAPE_ALIASES = {"self": "self_interaction"}

    def __post_init__(self) -> None:
        for name in ("batch", "tables", "dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise WorkloadError(f"{name} must be an integer, got {value!r}")
        if self.batch < 1:
            raise WorkloadError(f"batch must be >= 1, got {self.batch}")
        if self.tables < 1:
            raise WorkloadError(f"tables must be >= 1 (features F = tables + 1 must be >= 2), got {self.tables}")
        if self.dim < 1:
            raise WorkloadError(f"dim must be >= 1, got {self.dim}")
        if self.mode not in MODES:
            raise WorkloadError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.dtype not in DTYPES:
            raise WorkloadError(f"dtype must be one of {DTYPES} (others are not implemented), got {self.dtype!r}")
        if self.self_interaction and self.mode != "dot":
            raise WorkloadError("self_interaction only applies to mode=dot")

    @property
    def features(self) -> int:
        """F: the dense vector plus one embedding per table."""
        return self.tables + 1

    @property
    def pairs(self) -> int:
        """P: dot products kept, the strict lower triangle of Z (with its diagonal under self_interaction)."""
        f = self.features
        return f * (f + 1) // 2 if self.self_interaction else f * (f - 1) // 2

    @property
    def out_dim(self) -> int:
        return self.dim + self.pairs if self.mode == "dot" else self.dim * self.features


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


def space(w: Workload, target: Any) -> Space:
    """The knob space of this workload on a CPU ("llvm") or CUDA target."""
    kind = target.kind.name
    if kind == "cuda":
        return _cuda_space(w, target)
    if kind != "llvm":
        raise InvalidConfig(f"interaction has no schedule for target kind {kind!r}")
    return _cpu_space(w)


def _cpu_space(w: Workload) -> Space:
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


def schedule(sch: Any, w: Workload, cfg: Config, target: Any) -> None:
    """Apply a CPU config to `compute(w, cfg[LANES], cfg[PAIRS_PER_BLOCK], cfg[HSUM], cfg[PAIR_LAYOUT])`.

    CUDA kernels are written at the thread level by `compute_cuda` (see there why), so there is nothing left
    to schedule for them: `lower` builds them directly.
    """
    if target.kind.name != "llvm":
        raise InvalidConfig(f"interaction schedules only CPU modules; {target.kind.name} kernels come from lower()")
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
    """The scheduled IRModule for one config: what `tvm.compile` builds."""
    from tvm.s_tir import Schedule

    if target.kind.name == "cuda":
        return _lower_cuda(w, cfg, target)
    if target.kind.name != "llvm":
        raise InvalidConfig(f"interaction has no schedule for target kind {target.kind.name!r}")
    if w.mode == "cat":
        sch = Schedule(compute(w))
    else:
        sch = Schedule(compute(w, cfg[LANES], cfg[PAIRS_PER_BLOCK], cfg[HSUM], cfg[PAIR_LAYOUT]))
    schedule(sch, w, cfg, target)
    return sch.mod


# ---- CUDA -----------------------------------------------------------------------------------------------
# One kernel per call. A block takes `samples_per_block` samples at a time: it stages their F x D features in
# shared memory (coalesced vector loads of x and of the stacked embeddings), cuts the kept triangle of each
# Z = X X^T into R x R tiles, gives each tile to a group of `dot_lanes` threads that split D between them and
# sum their partial dot products with an xor-shuffle butterfly, and writes every output element once. The
# grid is sized for the tuned batch; a block loops over further groups of samples when the batch is larger.

SAMPLES_PER_BLOCK = Choice("samples_per_block", (1, 2, 4, 8), doc=(
    "Samples one thread block handles together (their features staged at once, their output rows one "
    "contiguous range). One sample per block gives the most blocks to spread over the SMs and the least "
    "shared memory per block (more resident blocks hide the staging latency); more samples give the threads "
    "of a block more tiles when F is small, and longer coalesced copies."))
STAGING = Choice("staging", ("padded", "shared", "none"), doc=(
    "Where the tiles read a sample's F x D features. 'padded': staged once in shared memory, each row padded "
    "by one vector so that rows read at the same offset by one warp fall in different banks; 'shared': staged "
    "unpadded (bank conflicts when D is a multiple of 32 floats, less shared memory); 'none': read from global "
    "memory through L1 (no staging barrier and no shared memory, so more resident blocks, but every reuse of "
    "a row goes through the L1 tag lookup)."))
PAIR_TILE = Choice("pair_tile", (4, 3, 2, 1), doc=(
    "Side R of the R x R block of Z = X X^T that one lane group computes (register tiling): R rows and R "
    "columns loaded per vector of D serve R*R dot products, so shared-memory loads per FMA fall as 2/R. "
    "Shared-memory bandwidth is the likely limit: at F=27, D=128 a sample needs an estimated 1750, 1050, 680 "
    "and 560 wavefronts (SM cycles) for R = 1..4, against 350-450 SM cycles of FMAs. R = 1 is one pair per "
    "lane group and computes nothing that is thrown away; tiles on the diagonal of larger R compute pairs "
    "above it that are discarded (15% extra FMAs at F=27 for R=3, 28% for R=4)."))
DOT_LANES = Choice("dot_lanes", (4, 1, 2, 8, 16, 32), doc=(
    "Threads that share one tile, each reading every lanes-th vector of D, their partial sums added by an "
    "xor-shuffle butterfly (log2(lanes) shuffles per accumulator). 1 = a serial dot product over D per thread; "
    "32 = a warp per tile. More lanes: more threads per sample (occupancy, latency hiding), neighbouring lanes "
    "read neighbouring vectors of one row (conflict-free, broadcast-friendly), shorter serial FMA chains; "
    "fewer lanes: fewer shuffles."))
VECTOR = Choice("vector", (4, 2, 1), doc=(
    "Floats per load (float4 / float2 / float) when staging the features and in the dot loop: 16-byte loads "
    "need the fewest instructions for the same bytes. Must divide D."))
THREADS = Choice("threads", (128, 256, 64, 512, 1024, 32), doc=(
    "Threads per block: with samples_per_block, how many tiles are in flight per block, and (with registers "
    "and shared memory per block) how many blocks an SM holds at once."))
OUTPUT = Choice("output", ("staged", "direct"), doc=(
    "'staged': pair sums go to shared memory and the block's output rows [x | pairs], one contiguous range, "
    "are written by consecutive threads (fully coalesced stores, one more barrier); 'direct': each lane "
    "writes its sums straight to global memory (scattered 4-byte stores within the row) and x is copied to "
    "the output while it is staged."))
COPY_ITEMS = Choice("items_per_thread", (4, 1, 2, 8), doc=(
    "mode=cat: vectors each thread loads before it stores them (memory-level parallelism of the copy: more "
    "bytes in flight per thread, fewer blocks)."))


@dataclass(frozen=True)
class TileGrid:
    """The kept triangle of Z cut into R x R tiles, numbered without a table.

    Tile rows k = 0..n-1 hold k + 1 tiles (the triangle of tiles with its diagonal). Row k is folded onto row
    n-1-k, so together they fill one row of n + 1 tiles, and a flat tile index t maps to (tile row, tile
    column) with one division: f, c = divmod(t, n + 1) gives (f, c) when c <= f, else (n-1-f, c-f-1). For
    R = 1 without the diagonal, the strict triangle of the F rows is that triangle for rows 1..F-1 (offset 1).
    Tiles reaching past the last row or above the diagonal compute pairs that are not written.
    """

    side: int
    n: int
    offset: int

    @property
    def count(self) -> int:
        return self.n * (self.n + 1) // 2

    def origin(self, t: int) -> tuple[int, int]:
        """(first row, first column) of tile t (Python ints or TIR expressions)."""
        from tvm import tirx

        fold, col = t // (self.n + 1), t % (self.n + 1)
        lower = col <= fold
        if isinstance(lower, bool):
            row, col = (fold, col) if lower else (self.n - 1 - fold, col - fold - 1)
        else:
            row, col = tirx.if_then_else(lower, fold, self.n - 1 - fold), tirx.if_then_else(lower, col, col - fold - 1)
        return (row + self.offset) * self.side, col * self.side


def tile_grid(w: Workload, side: int) -> TileGrid:
    """The R x R tiles that cover this workload's kept pairs."""
    if side == 1 and not w.self_interaction:
        return TileGrid(side, w.features - 1, 1)
    return TileGrid(side, -(-w.features // side), 0)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _cuda_row_floats(w: Workload, cfg: Config) -> int:
    """Row stride of the staged features: D, or D plus one vector (shifts each row by 16 bytes of banks)."""
    return w.dim + cfg[VECTOR] if cfg[STAGING] == "padded" else w.dim


def cuda_shared_bytes(w: Workload, cfg: Config) -> int:
    """Static shared memory of a dot-mode config: staged features and staged pair sums of its samples."""
    samples = cfg[SAMPLES_PER_BLOCK]
    feat = samples * w.features * _cuda_row_floats(w, cfg) if cfg[STAGING] != "none" else 0
    res = samples * w.pairs if cfg[OUTPUT] == "staged" else 0
    return 4 * (feat + res)


def _cuda_space(w: Workload, target: Any) -> Space:
    """GPU knobs, restricted to what the target's limits (threads, shared memory, warp size) allow."""
    max_threads = int(target.attrs["max_threads_per_block"])
    max_shared = int(target.attrs["max_shared_memory_per_block"])
    warp = int(target.attrs["thread_warp_size"])
    threads = THREADS.only(t for t in THREADS.options if t <= max_threads and t % warp == 0)
    vector = VECTOR.only(v for v in VECTOR.options if w.dim % v == 0)
    if w.mode == "cat":
        return Space([vector, threads, COPY_ITEMS])
    samples = SAMPLES_PER_BLOCK.only(s for s in SAMPLES_PER_BLOCK.options if s == 1 or s <= w.batch)
    tiles = PAIR_TILE.only(r for r in PAIR_TILE.options if r <= w.features)
    lanes = DOT_LANES.only(n for n in DOT_LANES.options if n <= warp and w.dim % n == 0)

    def lane_slots(c: Config) -> int:  # threads the tile phase of one block can use
        return c[SAMPLES_PER_BLOCK] * tile_grid(w, c[PAIR_TILE]).count * c[DOT_LANES]

    return Space([samples, STAGING, tiles, lanes, vector, threads, OUTPUT], [
        Constraint("dot_lanes x vector must divide D (every lane reads whole vectors of every chunk)",
                   lambda c: w.dim % (c[DOT_LANES] * c[VECTOR]) == 0),
        Constraint(f"staged features and pair sums must fit the {max_shared} bytes of static shared memory",
                   lambda c: cuda_shared_bytes(w, c) <= max_shared),
        Constraint("threads must not exceed the tile phase's lanes rounded up to a warp (no idle warps)",
                   lambda c: c[THREADS] <= _round_up(lane_slots(c), warp)),
    ])


def _lower_cuda(w: Workload, cfg: Config, target: Any) -> Any:
    space(w, target).make(cfg.to_json())  # a config that skipped the space's constraints is refused here
    if w.mode == "cat":
        return compute_cuda_cat(w, cfg[VECTOR], cfg[THREADS], cfg[COPY_ITEMS])
    return compute_cuda(w, samples=cfg[SAMPLES_PER_BLOCK], staging=cfg[STAGING], tile=cfg[PAIR_TILE],
                        lanes=cfg[DOT_LANES], vector=cfg[VECTOR], threads=cfg[THREADS], output=cfg[OUTPUT],
                        warp=int(target.attrs["thread_warp_size"]))


@functools.lru_cache(maxsize=64)
def compute_cuda(w: Workload, samples: int = 1, staging: str = "padded", tile: int = 2, lanes: int = 4,
                 vector: int = 4, threads: int = 128, output: str = "staged", warp: int = 32) -> Any:
    """The fused dot interaction as a CUDA kernel in TVMScript, written at the thread level for one config.

    The kernel is written with its thread mapping rather than as a compute plus schedule: the pair -> (i, j)
    maps of a triangle are not quasi-affine, and TVM's loop primitives (compute_at, rfactor, bind) refuse
    blocks indexed by them. Phases of a group of samples, separated by barriers TVM inserts: stage (x and
    ly rows to shared memory), tiles (dot products in registers, lane shuffles, sums to shared memory or to
    the output) and, when staged, the copy of the output rows. Every thread runs every phase uniformly (tile
    indices are clamped, writes are guarded), so full-mask shuffles are safe.
    """
    import tvm
    from tvm.script import tirx as T

    if w.mode != "dot":
        raise InvalidConfig("compute_cuda is the dot interaction; cat has compute_cuda_cat")
    D, NT, F, P = w.dim, w.tables, w.features, w.pairs
    O, S, R, L, V, TB = D + P, samples, tile, lanes, vector, threads
    if D % (L * V) or TB % L or L & (L - 1) or L > warp:
        raise InvalidConfig(f"lanes {L} x vector {V} must divide dim {D}, lanes a power of two <= {warp}")
    if staging not in STAGING.options or output not in OUTPUT.options:
        raise InvalidConfig(f"unknown staging {staging!r} or output {output!r}")
    grid = tile_grid(w, R)
    staged, out_staged = staging != "none", output == "staged"
    DS = D + V if staging == "padded" else D  # row stride of the staged features
    DV = D // V  # vectors per feature row
    GROUPS = TB // L  # lane groups of a block: tiles in flight
    U = S * grid.count  # tiles per block
    DIAG = int(w.self_interaction)
    BLOCKS = -(-w.batch // S)
    LOG_L = L.bit_length() - 1  # steps of the lanes' xor butterfly

    def pair_index(i: Any, j: Any) -> Any:  # position of Z[i, j] among the kept pairs (row-major)
        return i * (i + 2 * DIAG - 1) // 2 + j

    def dense(x: Any, feat: Any, b: Any, s: Any, d: Any) -> Any:  # x[b, d], staged or not
        return feat[s * F * DS + d] if staged else x[b, d]

    def loop(n: int) -> Any:  # short staging loops are unrolled: all their loads in flight at once
        return T.unroll(n) if n <= 16 else T.serial(n)

    @T.macro
    def load_row(x, ly, feat, dst, slot, row, s, b, d0):
        """dst[slot*V : slot*V+V] = features[row][d0 : d0+V] of sample s (batch row b)."""
        if staged:
            for v in T.vectorized(V):
                dst[slot * V + v] = feat[(s * F + row) * DS + d0 + v]
        else:
            if row == 0:
                for v in T.vectorized(V):
                    dst[slot * V + v] = x[b, d0 + v]
            else:
                for v in T.vectorized(V):
                    dst[slot * V + v] = ly[b, row - 1, d0 + v]

    @T.macro
    def stage(x, ly, feat, out, b0, B):
        # x rows: S x D contiguous floats of x, to the staged features and/or the dense part of the output
        if staged or not out_staged:
            for it in loop(-(-S * DV // TB)):
                for tx in T.thread_binding(TB, thread="threadIdx.x"):
                    e: T.let = it * TB + tx  # vector e % DV of sample e // DV
                    if e < S * DV and b0 + e // DV < B:
                        xv = T.alloc_local((V,), "float32")
                        for v in T.vectorized(V):
                            xv[v] = x[b0 + e // DV, e % DV * V + v]
                        if staged:
                            for v in T.vectorized(V):
                                feat[e // DV * F * DS + e % DV * V + v] = xv[v]
                        if not out_staged:  # output rows are not 16-byte aligned: scalar stores
                            for v in T.unroll(V):
                                out[b0 + e // DV, e % DV * V + v] = xv[v]
        # ly rows: S x T x D contiguous floats of the stacked embeddings, to feature rows 1..T
        if staged:
            for it in loop(-(-S * NT * DV // TB)):
                for tx in T.thread_binding(TB, thread="threadIdx.x"):
                    e: T.let = it * TB + tx  # vector e % DV of table e // DV % T of sample e // (T * DV)
                    if e < S * NT * DV and b0 + e // (NT * DV) < B:
                        for v in T.vectorized(V):
                            feat[(e // (NT * DV) * F + e // DV % NT + 1) * DS + e % DV * V + v] = (
                                ly[b0 + e // (NT * DV), e // DV % NT, e % DV * V + v])

    @T.macro
    def tiles(x, ly, feat, res, out, b0, B):
        for it in range(-(-U // GROUPS)):
            for tx in T.thread_binding(TB, thread="threadIdx.x"):
                acc = T.alloc_local((R * R,), "float32")
                rows = T.alloc_local((R * V,), "float32")
                cols = T.alloc_local((R * V,), "float32")
                u: T.let = T.min(it * GROUPS + tx // L, U - 1)  # clamped, so that every lane joins the shuffles
                s: T.let = u // grid.count
                i0: T.let = grid.origin(u % grid.count)[0]
                j0: T.let = grid.origin(u % grid.count)[1]
                b: T.let = T.min(b0 + s, B - 1)
                for q in T.unroll(R * R):
                    acc[q] = T.float32(0)
                for k in range(D // (L * V)):  # this lane's vectors: k * L + lane
                    for r in T.unroll(R):
                        load_row(x, ly, feat, rows, r, T.min(i0 + r, F - 1), s, b, (k * L + tx % L) * V)
                    for r in T.unroll(R):
                        load_row(x, ly, feat, cols, r, T.min(j0 + r, F - 1), s, b, (k * L + tx % L) * V)
                    for r in T.unroll(R):
                        for c in T.unroll(R):
                            for v in T.unroll(V):
                                acc[r * R + c] = acc[r * R + c] + rows[r * V + v] * cols[c * V + v]
                for q in T.unroll(R * R):
                    for step in T.unroll(LOG_L):
                        acc[q] = acc[q] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), acc[q], L >> (step + 1),
                                                                 L, warp)
                for r in T.unroll(R):
                    for c in T.unroll(R):
                        # a kept pair of a real tile and sample, written by one lane (lanes take turns)
                        if (it * GROUPS + tx // L < U and b0 + s < B and i0 + r < F and j0 + c < i0 + r + DIAG
                                and tx % L == (r * R + c) % L):
                            if out_staged:
                                res[s * P + pair_index(i0 + r, j0 + c)] = acc[r * R + c]
                            else:
                                out[b0 + s, D + pair_index(i0 + r, j0 + c)] = acc[r * R + c]

    @T.macro
    def write_rows(x, feat, res, out, b0, B):
        # the block's output rows are one contiguous range of out: consecutive threads, consecutive floats
        for it in range(-(-S * O // TB)):
            for tx in T.thread_binding(TB, thread="threadIdx.x"):
                e: T.let = it * TB + tx  # element e % O of sample e // O
                if e < S * O and b0 + e // O < B:
                    out[b0 + e // O, e % O] = T.if_then_else(
                        e % O < D, dense(x, feat, b0 + e // O, e // O, T.min(e % O, D - 1)),
                        res[e // O * P + T.max(e % O - D, 0)])

    @T.prim_func
    def main(x_: T.handle, ly_: T.handle, out_: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        B = T.int32()
        x = T.match_buffer(x_, (B, D), "float32")
        ly = T.match_buffer(ly_, (B, NT, D), "float32")
        out = T.match_buffer(out_, (B, O), "float32")
        for bx in T.thread_binding(BLOCKS, thread="blockIdx.x"):
            feat = T.alloc_shared((S * F * DS if staged else 1,), "float32")
            res = T.alloc_shared((S * P if out_staged else 1,), "float32")
            for group in range((B + BLOCKS * S - 1) // (BLOCKS * S)):
                stage(x, ly, feat, out, (group * BLOCKS + bx) * S, B)
                tiles(x, ly, feat, res, out, (group * BLOCKS + bx) * S, B)
                if out_staged:
                    write_rows(x, feat, res, out, (group * BLOCKS + bx) * S, B)

    return tvm.IRModule({"main": main})


@functools.lru_cache(maxsize=16)
def compute_cuda_cat(w: Workload, vector: int = 4, threads: int = 256, items: int = 4) -> Any:
    """cat([x] + ly, dim=1) as a CUDA copy kernel: each thread loads `items` vectors of the output, then stores
    them; consecutive threads take consecutive vectors (coalesced loads and stores)."""
    import tvm
    from tvm.script import tirx as T

    D, NT, F = w.dim, w.tables, w.features
    V, TB, K = vector, threads, items
    if D % V:
        raise InvalidConfig(f"vector {V} must divide dim {D}")
    DV, RV = D // V, F * D // V  # vectors per x row, per output row
    BLOCKS = max(1, -(-w.batch * RV // (TB * K)))

    @T.prim_func
    def main(x_: T.handle, ly_: T.handle, out_: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        B = T.int32()
        x = T.match_buffer(x_, (B, D), "float32")
        ly = T.match_buffer(ly_, (B, NT, D), "float32")
        out = T.match_buffer(out_, (B, F * D), "float32")
        for bx in T.thread_binding(BLOCKS, thread="blockIdx.x"):
            for group in range((B * RV + BLOCKS * TB * K - 1) // (BLOCKS * TB * K)):
                for tx in T.thread_binding(TB, thread="threadIdx.x"):
                    buf = T.alloc_local((K * V,), "float32")
                    first: T.let = (group * BLOCKS + bx) * K * TB + tx  # vector index of item 0 in the flat output
                    for k in T.unroll(K):  # all loads first: K vectors in flight per thread
                        if (first + k * TB) // RV < B:
                            if (first + k * TB) % RV < DV:
                                for v in T.vectorized(V):
                                    buf[k * V + v] = x[(first + k * TB) // RV, (first + k * TB) % RV * V + v]
                            else:
                                for v in T.vectorized(V):
                                    buf[k * V + v] = ly[(first + k * TB) // RV, ((first + k * TB) % RV - DV) // DV,
                                                        ((first + k * TB) % RV - DV) % DV * V + v]
                    for k in T.unroll(K):
                        if (first + k * TB) // RV < B:
                            for v in T.vectorized(V):
                                out[(first + k * TB) // RV, (first + k * TB) % RV * V + v] = buf[k * V + v]

    return tvm.IRModule({"main": main})


# ---- data, reference, validation ---------------------------------------------------------------------
def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(x, ly): dense features (B, D) and the T embeddings stacked as (B, T, D), torch float32 on the CPU."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(w.batch, w.dim, generator=gen)
    ly = torch.randn(w.batch, w.tables, w.dim, generator=gen)
    return x, ly


def _as_list(ly: Any) -> list[Any]:
    import torch

    return list(ly.unbind(1)) if isinstance(ly, torch.Tensor) else list(ly)


def reference(w: Workload, x: Any, ly: Any) -> Any:
    """DLRM's interact_features; `ly` is a list of T (B, D) tensors (as DLRM passes it) or a stacked (B, T, D)."""
    import torch

    ly = _as_list(ly)
    if w.mode == "cat":
        return torch.cat([x] + ly, dim=1)
    batch_size, d = x.shape
    t = torch.cat([x] + ly, dim=1).view((batch_size, -1, d))
    z = torch.bmm(t, torch.transpose(t, 1, 2))
    f = t.shape[1]
    li, lj = torch.tril_indices(f, f, offset=0 if w.self_interaction else -1, device=z.device)
    return torch.cat([x, z[:, li, lj]], dim=1)


def check_inputs(w: Workload, x: Any, ly: Any) -> None:
    """Raise a clear error for tensors the kernel cannot take (any batch size works; any one device)."""
    import torch

    def need(cond: bool, msg: str, exc: type[Exception] = ValueError) -> None:
        if not cond:
            raise exc(f"interaction: {msg}")

    def same_device(name: str, t: Any) -> None:
        need(t.device == x.device, f"{name} is on {t.device} but x is on {x.device}: all inputs must be on one device")

    need(isinstance(x, torch.Tensor), f"x must be a torch.Tensor, got {type(x).__name__}", TypeError)
    need(x.dtype == torch.float32, f"x must be float32, got {x.dtype}", TypeError)
    need(x.dim() == 2 and x.shape[1] == w.dim, f"x must be (batch, {w.dim}), got {tuple(x.shape)}")
    need(x.is_contiguous(), "x must be contiguous")
    batch = x.shape[0]
    if x.device.type == "cuda":  # the CUDA kernels index with 32-bit integers
        need(batch * max(w.tables * w.dim, w.out_dim) < 2**31,
             f"batch {batch} is too large for one CUDA call at this shape (32-bit indexing): split the batch")
    if isinstance(ly, torch.Tensor):
        need(ly.dtype == torch.float32, f"ly must be float32, got {ly.dtype}", TypeError)
        same_device("ly", ly)
        need(ly.dim() == 3 and tuple(ly.shape[1:]) == (w.tables, w.dim),
             f"stacked ly must be (batch, {w.tables}, {w.dim}), got {tuple(ly.shape)}")
        need(ly.shape[0] == batch, f"ly has batch {ly.shape[0]} but x has {batch}")
        need(ly.is_contiguous(), "stacked ly must be contiguous")
        return
    need(isinstance(ly, (list, tuple)),
         f"ly must be a list of {w.tables} (batch, {w.dim}) tensors or a (batch, {w.tables}, {w.dim}) tensor, "
         f"got {type(ly).__name__}", TypeError)
    need(len(ly) == w.tables, f"ly must hold {w.tables} tensors (one per table), got {len(ly)}")
    for k, e in enumerate(ly):
        need(isinstance(e, torch.Tensor), f"ly[{k}] must be a torch.Tensor, got {type(e).__name__}", TypeError)
        need(e.dtype == torch.float32, f"ly[{k}] must be float32, got {e.dtype}", TypeError)
        same_device(f"ly[{k}]", e)
        need(tuple(e.shape) == (batch, w.dim), f"ly[{k}] must be ({batch}, {w.dim}), got {tuple(e.shape)}")


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], x: Any, ly: Any) -> tuple[Sequence[Any], Any]:
    """(x, ly stacked (B, T, D), out) and out, on the inputs' device. A list `ly` is stacked here: that is a
    copy of all embeddings (B*T*D floats), which a caller that already holds them stacked avoids by passing
    the (B, T, D) tensor. The CUDA kernels load 16-byte vectors: a view starting mid-vector is copied."""
    import torch

    if not isinstance(ly, torch.Tensor):
        ly = torch.stack(list(ly), dim=1)
    if x.device.type == "cuda":
        x, ly = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (x, ly))
    out = torch.empty(x.shape[0], w.out_dim, dtype=torch.float32, device=x.device)
    return [x, ly, out], out


def baselines(w: Workload, x: Any, ly: Any) -> dict[str, Callable[[], Any]]:
    """PyTorch paths for the same op, prepared outside the timed call: DLRM's own code (one tensor per table,
    the triangle gathered with two index tensors) and a faster variant (stacked embeddings, one flat
    index_select of the triangle)."""
    import torch

    ly_list = [t.contiguous() for t in _as_list(ly)]  # DLRM holds one tensor per embedding table
    stacked = ly if isinstance(ly, torch.Tensor) else torch.stack(ly_list, dim=1)
    paths: dict[str, Callable[[], Any]] = {"torch dlrm (list ly)": lambda: reference(w, x, ly_list)}
    if w.mode == "cat":
        paths["torch cat (stacked ly)"] = lambda: torch.cat([x, stacked.flatten(1)], dim=1)
        return paths
    f = w.features
    li, lj = torch.tril_indices(f, f, offset=0 if w.self_interaction else -1, device=stacked.device)
    flat = li * f + lj

    def bmm_index_select() -> Any:
        t = torch.cat([x.unsqueeze(1), stacked], dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        return torch.cat([x, z.flatten(1).index_select(1, flat)], dim=1)

    paths["torch bmm + index_select (stacked ly)"] = bmm_index_select
    return paths


def traffic(w: Workload, x: Any, ly: Any) -> Traffic:
    """Bytes read and written once; for dot, the useful flops are 2*B*P*D (the kept dot products only)."""
    batch = x.shape[0]
    moved = 4.0 * batch * (w.dim * w.features + w.out_dim)
    if w.mode == "cat":
        return Traffic(bytes=moved, ops=0.0, unit="GB/s")
    return Traffic(bytes=moved, ops=2.0 * batch * w.pairs * w.dim, unit="GFLOPS")


def tolerance(w: Workload) -> tuple[float, float]:
    """fp32 dot products of length D summed in another order than MKL's bmm: error grows with D."""
    if w.mode == "cat":
        return (0.0, 0.0)
    return (1e-4, 1e-5 * max(8, w.dim))
