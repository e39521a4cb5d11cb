"""x86 int8 dot-product tensor intrinsics, registered lazily and only those a template asks for.

Two intrinsics, registered on first use:
- VNNI (u8 x s8 -> s32, 16 lanes x 4 k, `vpdpbusd`). TVM ships one (`dot_16x4_vnni` in
  tvm.s_tir.tensor_intrin.x86), but it passes <16 x i32> operands where LLVM 22's `vpdpbusd.512` takes
  <64 x i8>, and fails LLVM's verifier; ours is the same description with LLVM 22's signature. (Importing
  TVM's module would also cost `import tvm.s_tir.tensor_intrin`, which parses every backend's intrinsics.)
- AVX2 without VNNI (s8 x s8 -> s32 exactly, 8 lanes x 2 k, sign extension + `pmaddwd`).
"""

from __future__ import annotations


VNNI_16x4 = "autotune_dot_16x4_u8s8s32_vnni"  # u8 x s8 -> s32, 16 lanes x 4 (AVX-512 VNNI vpdpbusd)
AVX2_8x2 = "autotune_dot_8x2_s8s8s32_avx2"  # ours: s8 x s8 -> s32, 8 lanes x 2 (AVX2 vpmovsxbw + vpmaddwd)

_loaded: set[str] = set()


def _register_vnni() -> None:
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((4,), "uint8", offset_factor=1), B: T.Buffer((16, 4), "int8", offset_factor=1),
             C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

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

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((2,), "int8", offset_factor=1), B: T.Buffer((8, 2), "int8", offset_factor=1),
             C: T.Buffer((8,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:8], A[0:2], B[0:8, 0:2])
            T.writes(C[0:8])
            for i in T.serial(0, 8):
                for k in T.serial(0, 2):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

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


def ensure(name: str) -> str:
    """Register intrinsic `name` in this process if needed; returns the name for `sch.tensorize`."""
    if name not in _loaded:
        if name == VNNI_16x4:
            _register_vnni()
        elif name == AVX2_8x2:
            _register_avx2()
        else:
            raise KeyError(f"unknown intrinsic {name!r}")
        _loaded.add(name)
    return name


def cpu_has(target: object, *features: str) -> bool:
    """Whether the LLVM target's CPU has all `features` (LLVM names: "avx2", "avx512vnni", ...)."""
    from tvm.target import codegen

    return bool(codegen.llvm_cpu_has_features(list(features), target))
