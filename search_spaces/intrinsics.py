"""int8 dot-product tensor intrinsics (x86 and CUDA), registered lazily and only those a template asks for.

We register our own instead of importing `tvm.s_tir.tensor_intrin`: importing that package parses every
backend's intrinsics (about 80 s; its `cuda` module alone about 60 s), per build worker. Ours parse in well
under a second each and are registered on first use.

x86, registered on first use:
- VNNI (u8 x s8 -> s32, 16 lanes x 4 k, `vpdpbusd`). TVM ships one (`dot_16x4_vnni` in
  tvm.s_tir.tensor_intrin.x86), but it passes <16 x i32> operands where LLVM 22's `vpdpbusd.512` takes
  <64 x i8>, and fails LLVM's verifier; ours is the same description with LLVM 22's signature. (Importing
  TVM's module would also cost `import tvm.s_tir.tensor_intrin`, which parses every backend's intrinsics.)
- AVX2 without VNNI (s8 x s8 -> s32 exactly, 8 lanes x 2 k, sign extension + `pmaddwd`).
- AMX (Intel's tile unit: `tdpbssd`/`tdpbusd` multiply a 16 x 64-byte tile of activations by a 16 x 64-byte
  tile of weights into a 16 x 16 int32 tile, 16,384 products per instruction). TVM 0.27 ships none; ours
  (`amx_block`) is a whole register block over the whole reduction, registered per shape, since the
  accumulator tiles must stay in the tile registers from the first k to the last.

CUDA (the descriptions and implementations of TVM's `dp4a_s8s8s32` and `mma_*_i8*` intrinsics):
- dp4a: s8 x s8 -> s32, 4 k per instruction (`__dp4a`), operands in shared memory, accumulator in registers.
- int8 tensor cores (sm_80+): `ldmatrix` of 16x32 A and B tiles (B stored (N, K), as nn.Linear keeps it)
  into registers, `mma.sync.m16n8k32` into 16x16 int32 accumulator tiles held in registers, and a zero fill.
  The accumulator's layout (`accumulator_16x16`) is public so a template can read it in its epilogue.

  Unlike TVM's, these address each lane's own registers directly (no `lane * width` term in the offsets):
  the operand tiles are plain per-thread `local` buffers and only the accumulators are `warp` memory. TVM
  0.27's warp-memory lowering rewrites just one `warp` buffer per scope, and leaves index expressions it
  cannot fold; either way the fragments would end up in local memory (a stack frame) instead of registers.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable


VNNI_16x4 = "autotune_dot_16x4_u8s8s32_vnni"  # u8 x s8 -> s32, 16 lanes x 4 (AVX-512 VNNI vpdpbusd)
AVX2_8x2 = "autotune_dot_8x2_s8s8s32_avx2"  # ours: s8 x s8 -> s32, 8 lanes x 2 (AVX2 vpmovsxbw + vpmaddwd)
AVX2_8x4_U7 = "autotune_dot_8x4_u7s8s32_avx2"  # ours: u8 < 128 x s8 -> s32, 8 lanes x 4 (vpmaddubsw + vpmaddwd)

DP4A_S8 = "autotune_dp4a_s8s8s32"  # s8 x s8 -> s32, 4 k (CUDA __dp4a)
LDMATRIX_A_S8 = "autotune_mma_ldmatrix_s8_a"  # 16x32 A tile (m, k), shared -> warp registers
LDMATRIX_B_S8 = "autotune_mma_ldmatrix_s8_b_trans"  # 16x32 B tile stored (n, k), shared -> warp registers
MMA_S8 = "autotune_mma_s8s8s32_trans_b"  # 16x16x32 s8 x s8 -> s32 on tensor cores (sm_80+)

_loaded: set[str] = set()

AMX_TILES = 8  # tile registers: accumulators (m_tiles x n_tiles) + m_tiles activation + n_tiles weight tiles
AMX_ROWS, AMX_K = 16, 64  # a tile's rows, and the int8 k one activation tile row holds (64 bytes)


def _broadcast_dot_desc(lanes: int, k: int, a_dtype: str) -> Any:
    """What the x86 dot instructions compute: C[i] += sum_k A[k] * B[i, k] for `lanes` int32 lanes."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((k,), a_dtype, offset_factor=1), B: T.Buffer((lanes, k), "int8", offset_factor=1),
             C: T.Buffer((lanes,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:k], B[0:lanes, 0:k])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for j in T.serial(0, k):
                    with T.sblock("update"):
                        vi, vj = T.axis.remap("SR", [i, j])
                        C[vi] = C[vi] + T.cast(A[vj], "int32") * T.cast(B[vi, vj], "int32")

    return desc


def _register_vnni() -> None:
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    desc = _broadcast_dot_desc(16, 4, "uint8")

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((4,), "uint8", offset_factor=1), B: T.Buffer((16, 4), "int8", offset_factor=1),
             C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            a_quad = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
            a_bcast = T.reinterpret(T.broadcast(a_quad, 16), dtype="int8x64")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                C.vload([0], dtype="int32x16"), a_bcast, B.vload([0, 0], dtype="int8x64"), dtype="int32x16")

    TensorIntrin.register(VNNI_16x4, desc, impl, override=True)


def _register_avx2() -> None:
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    desc = _broadcast_dot_desc(8, 2, "int8")

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((2,), "int8", offset_factor=1), B: T.Buffer((8, 2), "int8", offset_factor=1),
             C: T.Buffer((8,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:8], A[0:2], B[0:8, 0:2])
            T.writes(C[0:8])
            a_pair = T.reinterpret(T.cast(A.vload([0], "int8x2"), "int16x2"), dtype="int32")
            a_bcast = T.reinterpret(T.broadcast(a_pair, 8), dtype="int16x16")
            b_i16 = T.cast(B.vload([0, 0], dtype="int8x16"), "int16x16")
            C[T.ramp(T.int32(0), 1, 8)] += T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"), a_bcast, b_i16, dtype="int32x8")

    TensorIntrin.register(AVX2_8x2, desc, impl, override=True)


def _register_avx2_u7() -> None:
    """u8 x s8 -> s32 in 8 lanes x 4 k: `vpmaddubsw` sums adjacent u8 x s8 products into int16 with saturation,
    `vpmaddwd` by ones widens pairs of those to int32. Exact only while a pair cannot pass 32767: the unsigned
    operand must stay below 128 (2 * 127 * 128 = 32512), which is why activations using 7 bits exist (FBGEMM's
    `reduce_range` has the same reason). Twice the products per instruction of the sign-extending path."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    desc = _broadcast_dot_desc(8, 4, "uint8")

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((4,), "uint8", offset_factor=1), B: T.Buffer((8, 4), "int8", offset_factor=1),
             C: T.Buffer((8,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:8], A[0:4], B[0:8, 0:4])
            T.writes(C[0:8])
            a_quad = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
            a_bcast = T.reinterpret(T.broadcast(a_quad, 8), dtype="int8x32")
            pairs = T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.ub.sw"), a_bcast,
                                            B.vload([0, 0], dtype="int8x32"), dtype="int16x16")
            C[T.ramp(T.int32(0), 1, 8)] += T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"), pairs, T.broadcast(T.int16(1), 16),
                dtype="int32x8")

    TensorIntrin.register(AVX2_8x4_U7, desc, impl, override=True)


def _register_dp4a() -> None:
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((4,), "int8", offset_factor=1, align=4, scope="shared"),
             B: T.Buffer((4,), "int8", offset_factor=1, align=4, scope="shared"),
             C: T.Buffer((1,), "int32", offset_factor=1, align=4, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0], A[0:4], B[0:4])
            T.writes(C[0])
            for k in range(4):
                with T.sblock("update"):
                    vk = T.axis.remap("R", [k])
                    C[0] = C[0] + T.cast(A[vk], "int32") * T.cast(B[vk], "int32")

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((4,), "int8", offset_factor=1, align=4, scope="shared"),
             B: T.Buffer((4,), "int8", offset_factor=1, align=4, scope="shared"),
             C: T.Buffer((1,), "int32", offset_factor=1, align=4, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0], A[0:4], B[0:4])
            T.writes(C[0])
            C[0] += T.call_pure_extern("__dp4a", A.vload([0], "int8x4"), B.vload([0], "int8x4"), T.int32(0),
                                       dtype="int32")

    TensorIntrin.register(DP4A_S8, desc, impl, override=True)


# ---- int8 tensor cores: ldmatrix + mma.sync m16n8k32, the layouts of TVM's `mma_*_i8*` intrinsics ----------
# A warp holds a 16x32 int8 operand tile as 32 threads x 16 bytes and a 16x16 int32 accumulator tile as 32
# threads x 8 values; these maps say which thread and which of its values hold element (i, j).


def ldmatrix_16x32(i: Any, j: Any) -> tuple[Any, Any]:
    """(thread, value) of element (i, j) of a 16x32 int8 operand tile (A row-major, B stored (N, K))."""
    return 4 * (i % 8) + (j % 16) // 4, 8 * (j // 16) + (i // 8) * 4 + j % 4


def accumulator_16x16(i: Any, j: Any) -> tuple[Any, Any]:
    """(thread, value) of element (i, j) of a 16x16 int32 accumulator tile."""
    return 4 * (i % 8) + (j % 8) // 2, 4 * (j // 8) + (i // 8) * 2 + j % 2


def _register_ldmatrix(name: str, operand: str) -> None:
    """16x32 int8 tile, shared -> warp registers, with one `ldmatrix.x4` (A: rows m, B: rows n; both k-contiguous)."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    rows, cols, width = 16, 32, 16  # width: int8 values each thread holds

    def row_offset(tx: Any, stride: Any) -> Any:  # the shared-memory element each thread points ldmatrix at
        if operand == "A":
            return stride * (tx % 16) + 16 * (tx // 16)
        return stride * 8 * (tx // 16) + (tx % 8) * stride + 16 * ((tx % 16) // 8)

    @T.prim_func(s_tir=True)
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (rows, cols), "int8", align=64, offset_factor=cols, scope="shared")
        warp = T.match_buffer(warp_handle, (32, width), "int8", align=64, offset_factor=cols, scope="local")
        with T.sblock("root"):
            T.reads(shared[0:rows, 0:cols])
            T.writes(warp[0:32, 0:width])
            for ax0, ax1 in T.grid(rows, cols):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(shared[v0, v1])
                    thread, value = T.meta_var(ldmatrix_16x32(v0, v1))
                    T.writes(warp[thread, value])
                    warp[thread, value] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_handle, (rows, cols), "int8", align=64, offset_factor=cols, scope="shared",
                                strides=[s0, s1])
        warp = T.match_buffer(warp_handle, (32, width), "int8", align=64, offset_factor=cols, scope="local")
        with T.sblock("root"):
            T.reads(shared[0:rows, 0:cols])
            T.writes(warp[0:32, 0:width])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.ldmatrix(False, 4, ".b16", warp.data, warp.elem_offset,
                                                 shared.access_ptr("r"), row_offset(tx, s0), dtype="int8"))

    TensorIntrin.register(name, desc, impl, override=True)


def _register_mma() -> None:
    """C(16x16, s32) += A(16x32, s8) x B(16x32 stored (N, K), s8)^T: two `mma.sync.m16n8k32` per call."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    width, width_out = 16, 8

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, width), "int8", align=64, offset_factor=32, scope="local")
        B = T.match_buffer(b, (32, width), "int8", align=64, offset_factor=32, scope="local")
        C = T.match_buffer(c, (32, 1, 1, width_out), "int32", align=64, offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0, 0, 0:width_out], A[0:32, 0:width], B[0:32, 0:width])
            T.writes(C[0:32, 0, 0, 0:width_out])
            for i, j, k in T.grid(16, 16, 32):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    tc, lc = T.meta_var(accumulator_16x16(vi, vj))
                    ta, la = T.meta_var(ldmatrix_16x32(vi, vk))
                    tb, lb = T.meta_var(ldmatrix_16x32(vj, vk))
                    T.reads(C[tc, 0, 0, lc], A[ta, la], B[tb, lb])
                    T.writes(C[tc, 0, 0, lc])
                    C[tc, 0, 0, lc] = C[tc, 0, 0, lc] + T.Cast("int32", A[ta, la]) * T.Cast("int32", B[tb, lb])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, width), "int8", align=64, offset_factor=32, scope="local")
        B = T.match_buffer(b, (32, width), "int8", align=64, offset_factor=32, scope="local")
        s0 = T.int32()
        s1 = T.int32()
        s2 = T.int32()
        C = T.match_buffer(c, (32, 1, 1, width_out), "int32", align=64, offset_factor=1, scope="warp",
                           strides=[s0, s1, s2, 1])
        with T.sblock("root"):
            T.reads(C[0:32, 0, 0, 0:width_out], A[0:32, 0:width], B[0:32, 0:width])
            T.writes(C[0:32, 0, 0, 0:width_out])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for half in T.unroll(2):  # n = 0..7, then 8..15
                    T.evaluate(T.ptx_legacy.mma(
                        "m16n8k32", "row", "col", "int8", "int8", "int32",
                        A.data, A.elem_offset,
                        B.data, B.elem_offset + half * (width // 2),
                        C.data, C.elem_offset + half * (width_out // 2),
                        False, dtype="int32"))

    TensorIntrin.register(MMA_S8, desc, impl, override=True)


def mma_fill(lane_values: int) -> str:
    """A zero fill of one 16x16 accumulator tile that, in fact, zeroes all `lane_values` accumulators each lane
    holds (every tile of its warp). Redundant per tile, but it tells TVM's warp-memory lowering how many values
    each lane owns, so the accumulators become plain registers; nvcc drops the repeated stores."""
    name = f"autotune_mma_fill_s32_lane{lane_values}"
    if name not in _loaded:
        _register_mma_fill(name, lane_values)
        _loaded.add(name)
    return name


def _register_mma_fill(name: str, lane_values: int) -> None:
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (32, 1, 1, 8), "int32", offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:32, 0, 0, 0:8])
            for i0, i1 in T.grid(16, 16):
                with T.sblock("C_init"):
                    i, j = T.axis.remap("SS", [i0, i1])
                    lane, value = T.meta_var(accumulator_16x16(i, j))
                    T.reads()
                    T.writes(C[lane, 0, 0, value])
                    C[lane, 0, 0, value] = T.int32(0)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        s2 = T.int32()
        C = T.match_buffer(c, (32, 1, 1, 8), "int32", offset_factor=1, scope="warp", strides=[s0, s1, s2, 1])
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:32, 0, 0, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.cuda.mma_fill_legacy(lane_values, C.data, 0, dtype="int32"))

    TensorIntrin.register(name, desc, impl, override=True)


def amx_fits(m_tiles: int, n_tiles: int) -> bool:
    """Whether a register block of m_tiles x n_tiles accumulator tiles, with the m_tiles activation and n_tiles
    weight tiles its products read, fits in the 8 tile registers."""
    return m_tiles * n_tiles + m_tiles + n_tiles <= AMX_TILES


def amx_block(m_tiles: int, n_tiles: int, k: int, a_dtype: str, task: tuple[int, int], k_total: int = 0) -> str:
    """The AMX intrinsic computing one register block C[16 m_tiles, 16 n_tiles] = sum over all `k` of
    A[., k] * W[., k], registered on first use; returns its name for `sch.tensorize`.

    A is (rows, k) int8 (`tdpbssd`) or uint8 (`tdpbusd`, no offset needed) with row stride k; W is packed
    (n/16, k/4, 16, 4), the layout VNNI uses, which is what a weight tile of 16 k-quads x 16 columns reads
    row by row (64 bytes); k is a multiple of 64. The accumulators start at zero (`tilezero`), stay in tile
    registers across k and are stored once.

    `k_total` > k: the block covers one block of k out of k_total (A's row stride and W's k extent): it adds
    to C (loaded into the accumulator tiles first, stored after), which the caller zeroed before its first
    k block, so a schedule can sweep a task's register blocks per k block while their operands stay in cache.

    The tile configuration (palette 1: all tiles 16 rows x 64 bytes) must be loaded on each thread before its
    first tile instruction, and `ldtilecfg` per block costs about a third of a block's time. A tensorized block
    sees no loop variables, only where its operands start: `task` (rows, columns of a parallel task) says which
    blocks are a task's first (its A row and W column both at a task boundary, at the first k), and only
    those load it. A task's blocks run on one thread, first block first."""
    if m_tiles < 1 or n_tiles < 1 or not amx_fits(m_tiles, n_tiles):
        raise ValueError(f"an AMX block of {m_tiles} x {n_tiles} accumulator tiles does not fit 8 tile registers")
    if k % AMX_K or a_dtype not in ("int8", "uint8") or task[0] % (AMX_ROWS * m_tiles) or task[1] % (16 * n_tiles):
        raise ValueError(f"AMX block: k={k} must be a multiple of {AMX_K}, A int8 or uint8 ({a_dtype}), and the task "
                         f"{task} whole blocks")
    if k_total and (k_total % k or k_total < k):
        raise ValueError(f"AMX block: k={k} must divide k_total={k_total}")
    k_total = k_total if k_total > k else 0
    name = f"autotune_amx_{a_dtype}_{m_tiles}x{n_tiles}_k{k}_task{task[0]}x{task[1]}"
    name += f"_of{k_total}" if k_total else ""
    if name not in _loaded:
        _register_amx(name, m_tiles, n_tiles, k, a_dtype, task, k_total)
        _loaded.add(name)
    return name


def _register_amx(name: str, mt: int, nt: int, kp: int, a_dtype: str, task: tuple[int, int], k_total: int) -> None:
    import tvm
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    rows, cols, nc = AMX_ROWS * mt, 16 * nt, mt * nt  # tiles: accumulators 0..nc-1, then A, then W
    task_rows, task_quads = task[0], task[1] // 16
    stride = k_total or kp  # A's row stride; W's k extent
    w_stride = stride * 16  # elements between W's 16-column blocks
    product = "llvm.x86.tdpbusd" if a_dtype == "uint8" else "llvm.x86.tdpbssd"
    adds = bool(k_total)  # one k block of several: C is read (zeroed by the caller first), no init

    def first_block(a_at: Any, b_at: Any) -> Any:  # the task's first: its first rows and columns (and k)
        at_task = tvm.tirx.all((a_at // stride) % task_rows == 0, (b_at // w_stride) % task_quads == 0)
        return tvm.tirx.all(at_task, a_at % stride == 0) if adds else at_task

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (rows, kp), a_dtype, offset_factor=1)
        B = T.match_buffer(b, (nt, kp // 4, 16, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (rows, cols), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(*([C[0:rows, 0:cols]] if adds else []), A[0:rows, 0:kp], B[0:nt, 0:kp // 4, 0:16, 0:4])
            T.writes(C[0:rows, 0:cols])
            for i, j, k in T.grid(rows, cols, kp):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    T.reads(C[vi, vj], A[vi, vk], B[vj // 16, vk // 4, vj % 16, vk % 4])
                    T.writes(C[vi, vj])
                    if not adds:  # the whole reduction: it starts from zero (one k block of several: from C)
                        with T.init():
                            C[vi, vj] = 0
                    C[vi, vj] = C[vi, vj] + T.cast(A[vi, vk], "int32") * T.cast(
                        B[vj // 16, vk // 4, vj % 16, vk % 4], "int32")

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        a_at = T.int32()
        b_at = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (rows, kp), a_dtype, elem_offset=a_at, strides=[stride, 1])
        B = T.match_buffer(b, (nt, kp // 4, 16, 4), "int8", elem_offset=b_at, strides=[w_stride, 64, 4, 1])
        C = T.match_buffer(c, (rows, cols), "int32", offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(A[0:rows, 0:kp], B[0:nt, 0:kp // 4, 0:16, 0:4])
            T.writes(C[0:rows, 0:cols])
            config = T.alloc_buffer((64,), "uint8", scope="local")
            if first_block(a_at, b_at):
                for byte in range(64):
                    config[byte] = T.uint8(0)
                config[0] = T.uint8(1)  # palette 1
                for t in range(AMX_TILES):
                    config[16 + 2 * t] = T.uint8(64)  # bytes per row (little-endian u16)
                    config[48 + t] = T.uint8(AMX_ROWS)  # rows
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(config[0])))
            for ti in T.unroll(mt):
                for tj in T.unroll(nt):
                    if adds:
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(ti * nt + tj),
                                                      T.address_of(C[ti * 16, tj * 16]), T.int64(sc * 4)))
                    else:
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.int8(ti * nt + tj)))
            for kb in range(kp // AMX_K):
                for ti in T.unroll(mt):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(nc + ti),
                                                  T.address_of(A[ti * 16, kb * AMX_K]), T.int64(stride)))
                for tj in T.unroll(nt):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(nc + mt + tj),
                                                  T.address_of(B[tj, kb * 16, 0, 0]), T.int64(64)))
                for ti in T.unroll(mt):
                    for tj in T.unroll(nt):
                        T.evaluate(T.call_llvm_intrin("void", product, T.int8(ti * nt + tj), T.int8(nc + ti),
                                                      T.int8(nc + mt + tj)))
            for ti in T.unroll(mt):
                for tj in T.unroll(nt):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(ti * nt + tj),
                                                  T.address_of(C[ti * 16, tj * 16]), T.int64(sc * 4)))

    TensorIntrin.register(name, desc, impl, override=True)


_REGISTER: dict[str, Callable[[], None]] = {
    VNNI_16x4: _register_vnni,
    AVX2_8x2: _register_avx2,
    AVX2_8x4_U7: _register_avx2_u7,
    DP4A_S8: _register_dp4a,
    LDMATRIX_A_S8: partial(_register_ldmatrix, LDMATRIX_A_S8, "A"),
    LDMATRIX_B_S8: partial(_register_ldmatrix, LDMATRIX_B_S8, "B"),
    MMA_S8: _register_mma,
}


def ensure(name: str) -> str:
    """Register intrinsic `name` in this process if needed; returns the name for `sch.tensorize`."""
    if name not in _loaded:
        if name not in _REGISTER:
            raise KeyError(f"unknown intrinsic {name!r}")
        _REGISTER[name]()
        _loaded.add(name)
    return name


def cpu_has(target: object, *features: str) -> bool:
    """Whether the LLVM target's CPU has all `features` (LLVM names: "avx2", "avx512vnni", ...)."""
    from tvm.target import codegen

    return bool(codegen.llvm_cpu_has_features(list(features), target))
