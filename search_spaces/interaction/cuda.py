"""The CUDA interaction: its knobs and the thread-level kernels (dot and cat) of a config.

One kernel per call. A block takes `samples_per_block` samples at a time: it stages their F x D features in
shared memory (coalesced 16-byte loads of x and of the stacked embeddings), cuts the kept triangle of each
Z = X X^T into R x R register tiles, gives each tile to a group of `dot_lanes` threads that split D between them
and sum their partial dot products with an xor-shuffle butterfly, and writes every output row once, coalesced.
The kernel is written at the thread level (`compute_cuda`, see there why), not scheduled from a compute; its
grid is sized for the tuned batch and a block loops over further groups of samples when the batch is larger.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..space import Choice, Config, Constraint, InvalidConfig, Space
from .workload import Workload

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


def space(w: Workload, target: Any) -> Space:
    """GPU knobs, restricted to what the target's limits (threads, shared memory, warp size) allow."""
    if target.kind.name != "cuda":
        raise InvalidConfig(f"interaction has no GPU schedule for target kind {target.kind.name!r}")
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


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The kernel of one config: written at the thread level by `compute_cuda`, so there is nothing to schedule."""
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

