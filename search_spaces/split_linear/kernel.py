"""The TVMScript of split_linear's CPU kernels: parallel tasks of `rows_per_task` rows, each computing its rows'
output in register blocks of m_tiles x n_tiles 16 x 16 tiles, then the bias and ReLU as it writes them.

'amx': the task splits its rows of X into three bf16 pieces each (x = hi + mid + lo exactly: each piece the bf16
rounding of what the ones before left), in a scratch the tiles then load from; the weight comes split the same
way, packed once in the layout AMX's B tiles read (pairs of k per column). Per 32 of k, the six products of
pieces down to 2^-16 of the term (hi·hi, hi·mid, hi·lo, mid·hi, mid·mid, lo·hi; workload.py) accumulate in the
fp32 tiles (`tdpbf16ps`), grouped by X's piece so each A tile is loaded once.

Whole rows (the default): a task sweeps every column for its rows over the whole K, register block by register
block, rows outer: the rows' pieces (rows x K x 6 bytes) stay in cache, and the whole split weight (N x K x 6
bytes) streams past each 16 x m_tiles rows. Where that weight is large (DLRMv2's 3456-wide layers: 21 MB for
3456 -> 1024) it is read from memory 64 times a batch of 2048; blocked (`cols_per_task`, `k_block`): a task owns
a group of columns too, and runs k block by k block, its accumulators (rows x columns float32) kept in a buffer
between blocks, columns outer: a k block of the group's weight stays in L2 while the task's rows pass it, and
the rows' pieces of a k block (rows x k_block x 6 bytes) while the columns do. The sums are the same float32
sums in the same order either way (a tile's accumulators stored and loaded again unchanged).
'simd': float32 FMAs on the weight packed in 16-column panels (CPUs without AMX-BF16).
"""

from __future__ import annotations

from typing import Any

from .. import _amx_tiles as amx_tiles
from .workload import PIECES, Workload

__all__ = ["K_PAIR_BLOCK", "TILE", "compute", "k_block", "padded"]

TILE = amx_tiles.ROWS  # an AMX tile's rows, and the fp32 columns of an accumulator tile
K_PAIR_BLOCK = 32  # bf16 values of k one tile row holds (64 bytes)


def padded(w: Workload, n_tiles: int) -> tuple[int, int]:
    """(Kp, Np): K rounded up to whole tile rows of bf16 pairs, N to whole register blocks of columns."""
    cols = TILE * n_tiles
    return -(-w.k // K_PAIR_BLOCK) * K_PAIR_BLOCK, -(-w.n // cols) * cols


def k_block(kp: int, want: int) -> int:
    """The k block of a blocked kernel: the most whole tile rows (32 of k) dividing Kp, up to `want` (0: Kp)."""
    if not want or want >= kp:
        return kp
    size = max(K_PAIR_BLOCK, want // K_PAIR_BLOCK * K_PAIR_BLOCK)
    while kp % size:
        size -= K_PAIR_BLOCK
    return size


def compute(w: Workload, intrinsic: str, m_tiles: int, n_tiles: int, rows_per_task: int, cols_per_task: int = 0,
            k_blk: int = 0, cross: bool = False) -> Any:
    """The IRModule of one config: main(X (M, K), the packed weight, Bias (N,), Y (M, N)), M any size.
    `cols_per_task` (0: all) and `k_blk` (0: the whole K) block an 'amx' kernel (the module docstring). `cross`:
    main(X, the packed weight, Bias, X0 (M, N), XR (M, N), Y), Y = X0 * (X @ W.T + Bias) + XR (DCNv2's cross
    layer after its W product: split_linear_cross), no ReLU."""
    import tvm
    from tvm.script import tirx as T

    K, N, MT, NT, MB = w.k, w.n, m_tiles, n_tiles, rows_per_task
    Kp, Np = padded(w, NT)
    BR, BC = TILE * MT, TILE * NT  # a register block's rows and columns
    KB = k_block(Kp, k_blk)  # k per block (Kp: one block)
    NBK = Np // BC  # register blocks of columns
    GB = NBK if not cols_per_task else max(1, min(NBK, cols_per_task // BC))  # a task's register blocks of columns
    GROUPS = -(-NBK // GB)
    blocked = intrinsic == "amx" and (KB < Kp or GROUPS > 1)
    a_tile, b_tile = MT * NT, MT * NT + MT  # tile registers: accumulators, then A's, then B's
    relu, amx = w.relu, intrinsic == "amx"
    kv = K // 16 * 16  # X's columns copied 16 at a time; the rest one by one
    # the packed weight, flat: (PIECES, Np/16, Kp/2, 16, 2) bf16 bits, or (Np/16, K, 16) float32
    WN = PIECES * Np * Kp if amx else Np * K
    w_dtype = "int16" if amx else "float32"
    load_tile_config = amx_tiles.tile_config()

    @T.macro
    def put(Y, Bias, X0, XR, row, col, value):
        # Y[row, col] = the accumulated value plus the bias, through the ReLU, or DCNv2's cross tail on it
        # (x0 * (value + bias) + x: X0 and XR, the cross network's and the layer's inputs; None without a tail)
        if cross:
            Y[row, col] = X0[row, col] * (value + Bias[col]) + XR[row, col]
        elif relu:
            Y[row, col] = T.max(value + Bias[col], T.float32(0))
        else:
            Y[row, col] = value + Bias[col]

    @T.macro
    def store(Y, C, Bias, X0, XR, row0, col0, M):
        # the block's accumulators C (BR x BC) into Y's rows below M and columns below N
        for r in range(BR):
            if row0 + r < M:
                if col0 + BC <= N:
                    for c in T.vectorized(BC):
                        put(Y, Bias, X0, XR, row0 + r, col0 + c, C[r, c])
                else:
                    for c in range(N - col0):
                        put(Y, Bias, X0, XR, row0 + r, col0 + c, C[r, c])

    @T.macro
    def split_pieces(S, R, H, i, width):
        # S[p, i, :width] = piece p of R[:width], R left holding what the pieces leave (zero)
        for p in T.unroll(PIECES):
            for kc in range(width // 16):
                for k in T.vectorized(16):  # bf16 rounding, to nearest even, of R's float32 bits
                    H[k] = T.shift_right(
                        T.reinterpret("uint32", R[kc * 16 + k]) + T.uint32(0x7FFF)
                        + T.bitwise_and(T.shift_right(T.reinterpret("uint32", R[kc * 16 + k]), T.uint32(16)),
                                        T.uint32(1)), T.uint32(16))
                for k in T.vectorized(16):
                    S[p, i, kc * 16 + k] = T.Cast("uint16", H[k])
                for k in T.vectorized(16):
                    R[kc * 16 + k] = R[kc * 16 + k] - T.reinterpret("float32", T.shift_left(H[k], T.uint32(16)))

    @T.macro
    def split_rows(X, S, R, H, first, blocks, M):
        # S[p, i, :] = piece p of row first + i of X, for the task's blocks (zeros past M and past K): R holds
        # what is left to split
        for i in range(blocks * BR):
            if first + i < M:
                for kc in range(K // 16):
                    for k in T.vectorized(16):
                        R[kc * 16 + k] = X[first + i, kc * 16 + k]
                for k in range(kv, K):
                    R[k] = X[first + i, k]
                for k in range(K, Kp):
                    R[k] = T.float32(0)
            else:
                for k in T.vectorized(Kp):
                    R[k] = T.float32(0)
            split_pieces(S, R, H, i, Kp)

    @T.macro
    def tile_step(Wp, S, mi, nj, ks, k_row, a_stride):
        # the six products of one 32-wide step of k into the accumulators: X's pieces at column ks * 32 of S (rows
        # a_stride bytes apart), W's at tile row k_row of its packed k
        for pa in T.unroll(PIECES):  # X's piece: its A tiles loaded once for the products it takes part in
            for ti in T.unroll(MT):
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(a_tile + ti), T.address_of(
                    S[pa, mi * BR + ti * TILE, ks * K_PAIR_BLOCK]), T.int64(a_stride)))
            for pw in T.unroll(PIECES):
                if pa + pw < PIECES:  # the products down to 2^-16 of the term
                    for tj in T.unroll(NT):
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(b_tile + tj), T.address_of(
                            Wp[((pw * (Np // TILE) + nj * NT + tj) * (Kp // 2) + k_row) * 2 * TILE]), T.int64(64)))
                    for ti in T.unroll(MT):
                        for tj in T.unroll(NT):
                            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbf16ps", T.int8(ti * NT + tj),
                                                          T.int8(a_tile + ti), T.int8(b_tile + tj)))

    @T.macro
    def amx_block(Wp, S, C, mi, nj):
        for ti in T.unroll(MT):
            for tj in T.unroll(NT):
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.int8(ti * NT + tj)))
        for ks in range(Kp // K_PAIR_BLOCK):
            tile_step(Wp, S, mi, nj, ks, ks * TILE, Kp * 2)
        for ti in T.unroll(MT):
            for tj in T.unroll(NT):
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(ti * NT + tj),
                                              T.address_of(C[ti * TILE, tj * TILE]), T.int64(BC * 4)))

    @T.macro
    def simd_block(X, Wp, C, row0, nj, M):
        # C[r, :] = X[row0 + r, :] @ the block's BC columns, a vector FMA per 16 columns per k
        for r in range(BR):
            for c in T.vectorized(BC):
                C[r, c] = T.float32(0)
            if row0 + r < M:
                for k in range(K):
                    for v in T.unroll(NT):
                        C[r, T.ramp(v * TILE, 1, TILE)] = C[r, T.ramp(v * TILE, 1, TILE)] + T.broadcast(
                            X[row0 + r, k], TILE) * Wp[T.ramp(((nj * NT + v) * K + k) * TILE, 1, TILE)]

    @T.macro
    def split_block(X, S, R, H, first, blocks, M, k0):
        # S[p, i, :] = piece p of row first + i of X over k0 .. k0 + KB (zeros past M and past K)
        for i in range(blocks * BR):
            if first + i < M:
                if k0 + KB <= K:
                    for kc in range(KB // 16):
                        for k in T.vectorized(16):
                            R[kc * 16 + k] = X[first + i, k0 + kc * 16 + k]
                else:
                    for k in range(KB):
                        if k0 + k < K:
                            R[k] = X[first + i, k0 + k]
                        else:
                            R[k] = T.float32(0)
            else:
                for k in T.vectorized(KB):
                    R[k] = T.float32(0)
            split_pieces(S, R, H, i, KB)

    @T.macro
    def amx_k_block(Wp, S, Acc, mi, nj, gj, kb):
        # the register block (rows mi, the group's columns gj = columns nj of the layer) over k block kb, its
        # accumulators from Acc (zero at the first block) and back to it
        for ti in T.unroll(MT):
            for tj in T.unroll(NT):
                if kb == 0:
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.int8(ti * NT + tj)))
                else:
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(ti * NT + tj), T.address_of(
                        Acc[mi * BR + ti * TILE, gj * BC + tj * TILE]), T.int64(GB * BC * 4)))
        for ks in range(KB // K_PAIR_BLOCK):
            tile_step(Wp, S, mi, nj, ks, (kb * (KB // K_PAIR_BLOCK) + ks) * TILE, KB * 2)
        for ti in T.unroll(MT):
            for tj in T.unroll(NT):
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(ti * NT + tj), T.address_of(
                    Acc[mi * BR + ti * TILE, gj * BC + tj * TILE]), T.int64(GB * BC * 4)))

    @T.macro
    def store_acc(Y, Acc, Bias, X0, XR, row0, rows, col0, cols, M):
        # the task's accumulators (rows x cols) into Y's rows below M and columns below N
        for r in range(rows):
            if row0 + r < M:
                if col0 + cols <= N:
                    for cb in range(cols // BC):
                        for c in T.vectorized(BC):
                            put(Y, Bias, X0, XR, row0 + r, col0 + cb * BC + c, Acc[r, cb * BC + c])
                else:
                    for c in range(N - col0):
                        put(Y, Bias, X0, XR, row0 + r, col0 + c, Acc[r, c])

    @T.macro
    def blocked_task(X, Wp, Bias, X0, XR, Y, M, vt):
        # task vt: a group of columns of a block of rows, k block by k block
        Acc = T.sblock_alloc_buffer((MB, GB * BC), "float32")
        S = T.sblock_alloc_buffer((PIECES, MB, KB), "uint16")
        R = T.sblock_alloc_buffer((KB,), "float32")
        H = T.sblock_alloc_buffer((16,), "uint32")
        row0 = vt // GROUPS * MB
        group = vt % GROUPS
        blocks = T.min(T.int64(MB // BR), (M - row0 + BR - 1) // BR)
        cols = T.min(GB, NBK - group * GB)  # the group's register blocks (the last group's may be fewer)
        load_tile_config()
        for kb in range(Kp // KB):
            split_block(X, S, R, H, row0, blocks, M, kb * KB)
            for gj in range(cols):
                for mi in range(blocks):
                    amx_k_block(Wp, S, Acc, mi, group * GB + gj, gj, kb)
        store_acc(Y, Acc, Bias, X0, XR, row0, blocks * BR, group * GB * BC, cols * BC, M)

    @T.macro
    def rows_task(X, Wp, Bias, X0, XR, Y, M, vt):
        # task vt: a block of rows, every column over the whole K
        C = T.sblock_alloc_buffer((BR, BC), "float32")
        # register blocks holding the task's rows: the last task of a call (or a call of a few rows)
        # computes no block of rows past M
        blocks = T.min(T.int64(MB // BR), (M - vt * MB + BR - 1) // BR)
        if amx:
            S = T.sblock_alloc_buffer((PIECES, MB, Kp), "uint16")
            R = T.sblock_alloc_buffer((Kp,), "float32")
            H = T.sblock_alloc_buffer((16,), "uint32")
            load_tile_config()
            split_rows(X, S, R, H, vt * MB, blocks, M)
            for mi in range(blocks):
                for nj in range(Np // BC):
                    amx_block(Wp, S, C, mi, nj)
                    store(Y, C, Bias, X0, XR, vt * MB + mi * BR, nj * BC, M)
        else:
            for mi in range(blocks):
                for nj in range(Np // BC):
                    simd_block(X, Wp, C, vt * MB + mi * BR, nj, M)
                    store(Y, C, Bias, X0, XR, vt * MB + mi * BR, nj * BC, M)

    task = blocked_task if blocked else rows_task
    groups = GROUPS if blocked else 1  # tasks per block of rows

    if cross:  # one of the two is parsed: the other's tail buffers would not exist
        @T.prim_func(s_tir=True)
        def cross_main(x_: T.handle, w_: T.handle, b_: T.handle, x0_: T.handle, xr_: T.handle, y_: T.handle):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            M = T.int64()
            X = T.match_buffer(x_, (M, K), "float32", align=4)
            Wp = T.match_buffer(w_, (WN,), w_dtype)
            Bias = T.match_buffer(b_, (N,), "float32", align=4)
            X0 = T.match_buffer(x0_, (M, N), "float32", align=4)
            XR = T.match_buffer(xr_, (M, N), "float32", align=4)
            Y = T.match_buffer(y_, (M, N), "float32", align=4)
            for t in T.parallel((M + MB - 1) // MB * groups):
                with T.sblock("task"):
                    vt = T.axis.spatial((M + MB - 1) // MB * groups, t)
                    T.reads(X[0:M, 0:K], Wp[0:WN], Bias[0:N], X0[0:M, 0:N], XR[0:M, 0:N])
                    T.writes(Y[0:M, 0:N])
                    task(X, Wp, Bias, X0, XR, Y, M, vt)
        main = cross_main
    else:
        @T.prim_func(s_tir=True)
        def main(x_: T.handle, w_: T.handle, b_: T.handle, y_: T.handle):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            M = T.int64()
            X = T.match_buffer(x_, (M, K), "float32", align=4)  # a row view of a larger batch: 4-byte aligned
            Wp = T.match_buffer(w_, (WN,), w_dtype)
            Bias = T.match_buffer(b_, (N,), "float32", align=4)
            Y = T.match_buffer(y_, (M, N), "float32", align=4)
            for t in T.parallel((M + MB - 1) // MB * groups):
                with T.sblock("task"):
                    vt = T.axis.spatial((M + MB - 1) // MB * groups, t)
                    T.reads(X[0:M, 0:K], Wp[0:WN], Bias[0:N])
                    T.writes(Y[0:M, 0:N])
                    task(X, Wp, Bias, None, None, Y, M, vt)

    return tvm.IRModule({"main": main})
