"""What the embedding-bag kernels share: the signature of the CPU and CUDA TVMScript (cpu.py, cuda.py), and
the CPU kernels' software prefetch (also batched_embedding_bag's)."""

from __future__ import annotations

from typing import Any

from .workload import Workload

LINE_FLOATS = 16  # fp32 values in a 64-byte cache line: the CPU kernels' prefetch step


def signature(w: Workload, body: Any) -> Any:
    """The kernel's signature around a `body(W, I, Off, PSW, O, NB, NNZ)` macro: rows, indices and batch are
    symbolic; per-sample weights are an argument only when the workload has them."""
    import tvm
    from tvm.script import tirx as T

    D, idt = w.dim, w.index_dtype
    extra = 1 if w.include_last_offset else 0
    if w.per_sample_weights:
        @T.prim_func(s_tir=True)
        def main(w_: T.handle, ind: T.handle, off: T.handle, psw: T.handle, out: T.handle):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            R = T.int64()
            NNZ = T.int64()
            NB = T.int64()
            W = T.match_buffer(w_, (R, D), "float32")
            I = T.match_buffer(ind, (NNZ,), idt)
            Off = T.match_buffer(off, (NB + extra,), idt)
            PSW = T.match_buffer(psw, (NNZ,), "float32")
            O = T.match_buffer(out, (NB, D), "float32")
            body(W, I, Off, PSW, O, NB, NNZ)
    else:
        @T.prim_func(s_tir=True)
        def main(w_: T.handle, ind: T.handle, off: T.handle, out: T.handle):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            R = T.int64()
            NNZ = T.int64()
            NB = T.int64()
            W = T.match_buffer(w_, (R, D), "float32")
            I = T.match_buffer(ind, (NNZ,), idt)
            Off = T.match_buffer(off, (NB + extra,), idt)
            O = T.match_buffer(out, (NB, D), "float32")
            body(W, I, Off, W, O, NB, NNZ)  # PSW unused: the table stands in so the macro type-checks

    return tvm.IRModule({"main": main})


def prefetcher(lines: int) -> Any:
    """A TVMScript macro `prefetch_row(W, row)`: LLVM's prefetch of the first `lines` 64-byte cache lines of
    row `row` of W, in an opaque block that reads and writes nothing (a hint, not an access)."""
    from tvm.script import tirx as T

    @T.macro
    def prefetch_row(W, row):
        with T.sblock("prefetch"):
            T.reads()
            T.writes()
            for c in T.unroll(lines):
                T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(W[row, c * LINE_FLOATS]),
                                              0, 3, 1))

    return prefetch_row
